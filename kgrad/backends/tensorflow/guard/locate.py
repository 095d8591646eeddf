"""Where a probed step's first NaN/Inf was born: a `kgrad.ProbeResult` described for the shared rules.

`locate` reads a `kgrad.ProbeResult` (eagerly), describes each recorded call
as a `kgrad.backends.common.locate.Call` and applies the rules written once in
`kgrad.backends.common.locate`: the first operation whose inputs are all
finite and whose output is not (forward order), or, when the forward pass is
finite, the first operation whose backward pass turns a finite dJ/d(output)
into a non-finite dJ/d(input), from the loss down; before those, non-finite
weights and data. `kgrad.first_non_finite` (`first_non_finite.py`),
for `kgrad.ProbeTape` users, gives the same answer beside the first non-finite tensor.
"""

import tensorflow as tf

from kgrad.backends.common import locate as rules
from kgrad.plan import operations

# What a TensorFlow replay does not see, for the note of a value already non-finite at a call's input.
_UNSEEN_OPERATION = ("the tape does not capture (a TensorFlow op in a train_step or a call: mark its "
                     "result with kgrad.tap(name, tensor) to have it named)")


def _operations(model):
    """``fn(recorded name) -> (type, path)`` for the names a ProbeTape records."""
    if model is None:
        return lambda name: (None, None)
    named = operations.tappable_operations(model)
    paths = {}
    for path, operation in named.items():
        if len(path) >= len(paths.get(id(operation), "")):
            paths[id(operation)] = path

    def describe(name):
        base = name.split("#")[0]
        if base not in named and "/" in base:  # "name/0": a layer's first float output
            base = base.rsplit("/", 1)[0]
        operation = named.get(base)
        if operation is None:
            return rules.TAP_KIND, name  # only taps are recorded without being operations
        return type(operation).__name__, paths[id(operation)]

    return describe


def calls(probe, model=None):
    """The `kgrad.backends.common.locate.Call`s of a `kgrad.ProbeResult`, in forward order."""
    describe = _operations(model)
    # id(tensor) -> the names it was recorded under (a nested model's output is its last layer's).
    produced_by = {}
    for name, tensor in probe.activations.items():
        produced_by.setdefault(id(tensor), []).append(name)
    described = []
    for name, tensor in probe.activations.items():
        kind, path = describe(name)
        inputs = probe.layer_inputs.get(name, probe.layer_inputs.get(name.split("/")[0]))
        gradient = probe.gradients.get(name)
        takes = () if inputs is None else tuple(
            producer for leaf in tf.nest.flatten(inputs) for producer in produced_by.get(id(leaf), ())
        )
        described.append(rules.Call(
            name, kind, path, output=rules.counts(tensor),
            inputs=None if inputs is None else rules.counts(inputs),
            input_range=None if inputs is None else rules.finite_range(inputs),
            output_gradient=None if gradient is None else rules.counts(gradient), takes=takes,
        ))
    return described


def _loss_terms(loss_terms):
    """``fn() -> [Call]`` of `kgrad.backends.tensorflow.guard.loss_parts` terms, or ``None``."""
    if loss_terms is None:
        return None
    return lambda: [
        rules.Call(part["name"], part["type"], part["path"], output=rules.counts(part["value"]),
                   input_range=None if part["inputs"] is None else rules.finite_range(part["inputs"]))
        for part in loss_terms()
    ]


def in_weights(weights):
    """The first non-finite weight of a list of variables, as ``born_*`` fields, or ``None``."""
    return rules.in_weights((weight.path, weight) for weight in weights or ())


def locate(probe, model=None, loss=None, targets=None, sample_weight=None, weight_gradients=None,
           check_weights=True, loss_terms=None):
    """Where a probed step's first NaN/Inf was born, as `NonFiniteReport` fields.

    Checked in this order: the model's weights (made non-finite by an
    earlier update), the data (inputs, targets, sample weights), the forward
    pass (the first captured operation with finite inputs and a non-finite
    output; a `kgrad.tap` inside it is given as ``born_inside``), the loss
    (its first non-finite term, when ``loss_terms`` are given), then the
    backward pass from the loss down.

    Args:
        probe: The `kgrad.ProbeResult` of a ``ProbeTape(record_inputs=True)``
            (without it, every operation's input is unknown and the first
            non-finite output is named).
        model: The probed model (names, types and paths of its operations;
            its weights are checked first).
        loss: The loss tensor, if it was computed.
        targets, sample_weight: The batch's targets and sample weights.
        weight_gradients: ``dict`` weight path -> gradient, checked last.
        check_weights: Whether to check the model's weights (a replay checks
            them before its forward pass, which changes BatchNormalization's
            statistics).
        loss_terms: A function of no argument that returns the terms ``loss``
            adds up (`kgrad.backends.tensorflow.guard.loss_parts.loss_parts`); called only when the loss
            is the first non-finite value, which is then blamed on its first
            non-finite term (a layer's ``add_loss``, the compiled loss, a
            weight's regularizer).

    Returns:
        A ``dict`` of ``born_*`` fields, or ``None`` if everything is finite.

    Example:

    >>> import keras, numpy as np, tensorflow as tf, kgrad
    >>> from kgrad.backends.tensorflow.guard.locate import locate
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="first"),
    ...     keras.layers.Lambda(keras.ops.log, name="log"), keras.layers.Dense(1, name="out")])
    >>> model.layers[0].set_weights([-np.eye(2, dtype="float32"), np.zeros(2, "float32")])
    >>> with kgrad.ProbeTape(model, layers="all", record_inputs=True) as tape:
    ...     loss = tf.reduce_sum(model(tf.ones((1, 2))))
    >>> _ = tape.gradient(loss, model.trainable_variables)
    >>> born = locate(tape.probe, model, loss)
    >>> born["born_in"], born["born_at"], born["born_type"], born["born_nan_count"]
    ('forward', 'log', 'Lambda', 2)
    """
    return rules.locate(
        calls(probe, model),
        loss=None if loss is None else rules.Loss(rules.counts(loss), _loss_terms(loss_terms)),
        prediction_range=rules.finite_range(probe.prediction),
        weights=[(w.path, w) for w in model.weights] if model is not None and check_weights else (),
        data=(probe.input, targets, sample_weight),
        input_gradient=rules.counts(probe.input_gradient),
        weight_gradients=[(path, rules.counts(value)) for path, value in (weight_gradients or {}).items()],
        unseen_operation=_UNSEEN_OPERATION,
    )
