"""Where a probed step's first NaN/Inf was born: the replay's locating function.

`locate` reads a `kgrad.ProbeResult` (eagerly) and names the first operation
whose inputs are all finite and whose output is not (forward order), or, when
the forward pass is finite, the first operation whose backward pass turns a
finite dJ/d(output) into a non-finite dJ/d(input), from the loss down; before
those, non-finite weights and data. `kgrad.first_non_finite` (`first_non_finite.py`),
for `kgrad.ProbeTape` users, gives the same answer beside the first non-finite tensor.
"""

import numpy as np
import tensorflow as tf

from kgrad.plan import operations
from kgrad.plan.tag_names import io_names


def _float_arrays(structure):
    """The floating-point leaves of ``structure`` (tensors, variables, arrays) as arrays."""
    leaves = (np.asarray(leaf) for leaf in tf.nest.flatten(structure) if hasattr(leaf, "dtype"))
    return [values for values in leaves if values.dtype.kind == "f"]


def _counts(structure):
    """(nan, inf) over the float leaves of ``structure``."""
    nan = inf = 0
    for values in _float_arrays(structure):
        nan, inf = nan + int(np.isnan(values).sum()), inf + int(np.isinf(values).sum())
    return nan, inf


def _finite_range(structure):
    """(min, max) of the finite float values of ``structure``, or ``None`` if it has none."""
    finite = [values.astype(np.float64).ravel() for values in _float_arrays(structure)]
    finite = [values[np.isfinite(values)] for values in finite]
    finite = np.concatenate(finite) if finite else np.zeros([0])
    return (float(finite.min()), float(finite.max())) if finite.size else None


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
            return "kgrad.tap", name  # only taps are recorded without being operations
        return type(operation).__name__, paths[id(operation)]

    return describe


def _birth(born_in, name, kind, path, counts, input_range, **extra):
    return {
        "born_in": born_in, "born_at": name, "born_type": kind, "born_path": path,
        "born_nan_count": counts[0], "born_inf_count": counts[1], "born_input_range": input_range,
        **extra,
    }


def in_data(inputs, targets, sample_weight):
    """A non-finite input, target or sample weight: the NaN arrived with the data.

    Returns:
        The ``born_*`` fields of the first non-finite part, or ``None``.
    """
    parts = []
    for structure, prefix in ((inputs, "input"), (targets, "target"), (sample_weight, "sample_weight")):
        if structure is not None:
            # Each input, and each output's target and weights, by its name.
            names = io_names(structure, prefix)
            leaves = tf.nest.flatten(structure)
            parts += [
                (name if len(names) == 1 else f"{prefix}/{name}", leaf) for name, leaf in zip(names, leaves)
            ]
    for name, structure in parts:
        counts = _counts(structure) if structure is not None else (0, 0)
        if any(counts):
            return _birth("data", name, "input data", name, counts, _finite_range(structure))
    return None


def _in_loss(loss, loss_terms, prediction):
    """The first non-finite term of a non-finite loss (`guard.loss_parts`), else the loss itself."""
    if loss is None or not any(_counts(loss)):
        return None
    for part in loss_terms() if loss_terms is not None else ():
        counts = _counts(part["value"])
        if any(counts):
            inputs = None if part["inputs"] is None else _finite_range(part["inputs"])
            return _birth("forward", part["name"], part["type"], part["path"], counts, inputs)
    return _birth("forward", "loss", "loss", "loss", _counts(loss), _finite_range(prediction))


def _in_forward(probe, describe, loss, loss_terms=None):
    """The first recorded operation whose inputs are finite and whose output is not."""
    taps_inside = []  # non-finite taps recorded before the layer that encloses them
    carried = None  # the first operation with a non-finite input and output
    for name, tensor in probe.activations.items():
        counts = _counts(tensor)
        if not any(counts):
            continue
        kind, path = describe(name)
        if kind == "kgrad.tap":
            taps_inside.append((name, counts))
            continue
        inputs = probe.layer_inputs.get(name, probe.layer_inputs.get(name.split("/")[0]))
        if inputs is not None and any(_counts(inputs)):
            carried = carried or (name, kind, path, counts, _finite_range(inputs))
            continue  # it only carries a value born before it
        # Inputs unknown (no record_inputs): the first non-finite output is all we know.
        return _birth("forward", name, kind, path, counts, None if inputs is None else _finite_range(inputs),
                      born_inside=taps_inside[0][0] if taps_inside else None)
    if taps_inside:
        name, counts = taps_inside[0]
        return _birth("forward", name, "kgrad.tap", name, counts, None)
    if carried is not None:
        note = (f"Its input was already non-finite: the value was born before {carried[0]!r}, "
                "in an operation the tape does not capture (a TensorFlow op in a train_step "
                "or a call: mark its result with kgrad.tap(name, tensor) to have it named).")
        return _birth("forward", *carried, replay_note=note)
    return _in_loss(loss, loss_terms, probe.prediction)


def _consumer(probe, names, index):
    """The operation after ``names[index]`` that took its output as input (else the next one)."""
    produced = probe.activations[names[index]]
    later = [name for name in names[index + 1:] if name in probe.layer_inputs]
    for name in later:
        if any(leaf is produced for leaf in tf.nest.flatten(probe.layer_inputs[name])):
            return name
    return later[0] if later else None


def _in_backward(probe, describe):
    """The operation whose backward pass first turns finite dJ/d(output) into non-finite dJ/d(input)."""
    names = [name for name in probe.activations if probe.gradients.get(name) is not None]
    for index in reversed(range(len(names))):
        counts = _counts(probe.gradients[names[index]])
        if not any(counts):
            continue
        consumer = _consumer(probe, names, index)
        if consumer is None:  # dJ/dŷ itself: the loss's backward pass
            return _birth("backward", "loss", "loss", "loss", counts, _finite_range(probe.prediction))
        kind, path = describe(consumer)
        return _birth("backward", consumer, kind, path, counts, _finite_range(probe.layer_inputs[consumer]))
    if probe.input_gradient is not None and any(_counts(probe.input_gradient)) and names:
        kind, path = describe(names[0])
        counts = _counts(probe.input_gradient)
        input_range = _finite_range(probe.layer_inputs.get(names[0]))
        return _birth("backward", names[0], kind, path, counts, input_range)
    return None


def in_weights(weights):
    """The first non-finite weight (an earlier update made it so), as ``born_*`` fields, or ``None``."""
    for weight in weights or ():
        counts = _counts(weight)
        if any(counts):
            return _birth("weights", weight.path, "weight", weight.path, counts, _finite_range(weight))
    return None


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
    describe = _operations(model)
    found = (
        (in_weights(model.weights) if model is not None and check_weights else None)
        or in_data(probe.input, targets, sample_weight)
        or _in_forward(probe, describe, loss, loss_terms)
        or _in_backward(probe, describe)
    )
    if found is None:
        for path, gradient in (weight_gradients or {}).items():
            if gradient is not None and any(_counts(gradient)):
                return _birth("backward", path, "weight gradient", path, _counts(gradient), None)
    return found
