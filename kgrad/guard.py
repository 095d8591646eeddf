"""Finding the first NaN/Inf of a step: on-device check, host-side report.

Every guarded step computes one cheap reduction per watched tensor (its sum
of squares, which is non-finite whenever an element is NaN or Inf), a
branch on them and one around the optimizer's update; its flag returns with
the step's logs (the host reads no device variable for it). Only when that flag
trips does a second, exact pass count NaN and Inf per tensor, in forward
order (inputs, activations, prediction) and then backward order (dJ/dŷ,
dJ/d(activation) from the loss downward, weight gradients). A sum of
squares can also overflow for huge finite values; the exact pass then finds
nothing, the step is not reported and its update is applied.

dJ/dŷ is the one watched tensor that the training step does not compute
itself (kgrad evaluates the loss a second time for it): it is computed and
checked on a tripped step only, when the weight gradients are checked every
step. On the training path it is the output layer's activation gradient and
feeds every weight gradient, so a non-finite dJ/dŷ that can reach the
weights trips the guard through them; under Keras' logits shortcut (softmax
or sigmoid with cross-entropy) it is not on the training path at all.
"""

import dataclasses

import tensorflow as tf

from kgrad import taps
from kgrad.summaries import io_names

#: Kinds computed by the forward pass; the rest come from the backward pass.
FORWARD_KINDS = ("input", "activation", "prediction", "loss")

#: Key of the guard's flag in the outputs of a guarded train step; kgrad's
#: train function takes it out before Keras sees the logs.
TRIPPED_OUTPUT = "_kgrad_guard_tripped"


@dataclasses.dataclass(frozen=True)
class NonFiniteReport:
    """Where a step first went non-finite.

    Returned by `kgrad.first_non_finite` and kept by `kgrad.NonFiniteGuard`
    (``guard.report``); ``str(report)`` is the message printed.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> model = keras.Sequential([keras.Input((2,)),
    ...     keras.layers.Dense(2, name="hidden"), keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> x = np.ones((4, 2), "float32"); x[3, 1] = np.inf
    >>> guard = kgrad.NonFiniteGuard()
    >>> _ = model.fit(x, np.ones((4, 1)), batch_size=2, callbacks=[guard],
    ...               shuffle=False, verbose=0)
    >>> report = guard.report
    >>> report.step, report.kind, report.last_finite_step  # what the every-step check saw
    (1, 'loss', 0)
    >>> report.born_in, report.born_at, report.born_inf_count, report.batch_index  # the replay
    ('data', 'input', 1, 1)

    Attributes:
        step: ``optimizer.iterations`` of the bad step.
        tensor: Name of the first non-finite tensor, e.g. ``"grad/dense_2"``.
        layer: The layer (or tap, input, output, weight path) it belongs to.
        kind: ``"input"``, ``"activation"``, ``"prediction"``,
            ``"pred_grad"``, ``"grad"`` (dJ/d activation) or ``"weight_grad"``.
        pass_: ``"forward"`` or ``"backward"``.
        nan_count: NaN elements in that tensor.
        inf_count: Inf elements in that tensor.
        last_finite_step: The latest step on which every watched tensor was
            finite (``None`` if there was none).
        last_finite_norm: L2 norm of the same tensor on that step (``None``
            for dJ/dŷ, which is only computed on a tripped step, and when
            its sum of squares overflowed float32).
        last_summaries: Full summaries of that layer from the latest probed
            step, when a `kgrad.GradientProbe` ran alongside (else ``{}``).
        non_finite: ``dict`` tensor name -> (nan_count, inf_count) of every
            non-finite tensor of the step, in check order.
        born_in: Where the first NaN/Inf was born, found by replaying the
            step (`kgrad.replay`): ``"forward"``, ``"backward"``, ``"data"``
            (it arrived with the inputs, targets or sample weights) or
            ``"weights"`` (an earlier update made a weight non-finite);
            ``None`` when not replayed (see ``replay_note``).
        born_at: The layer, operation, `kgrad.tap`, input or weight it was
            born at: forward, the first one whose inputs are all finite and
            whose output is not; backward, the first one from the loss down
            whose dJ/d(input) is non-finite while dJ/d(output) is finite.
        born_type: Its class name (``"Lambda"``, ``"Sqrt"``, ``"kgrad.tap"``...).
        born_path: Its path in nested models (``"outer/inner"``).
        born_nan_count, born_inf_count: NaN and Inf elements of its output
            (backward: of dJ/d(its input)).
        born_input_range: ``(min, max)`` of the finite values of its (first)
            input, or ``None`` if it has none.
        born_inside: The `kgrad.tap` inside that layer where the value was
            first seen non-finite, or ``None``.
        born_step: For ``born_in="weights"``, the step whose update made
            the weight non-finite (the last update applied); else ``step``.
        born_tape: In a model's own ``train_step``, the `kgrad.ProbeTape`
            (its logged name) whose pass the value was born in; else ``None``.
        batch_index: The batch within the epoch (``None`` when unknown: with
            ``steps_per_execution > 1`` and a batch that variables cannot
            hold, ragged or strings).
        replayed: ``True`` if the replay reproduced the trip, ``False`` if it
            did not (then the fields above are ``None`` and the sentinel's
            fields are what is known), ``None`` if there was no replay.
        replay_note: Why there is no replay or it did not reproduce the
            trip, or what may make the replay differ from the step.
        reproduce: The three lines of Python that replay the step from the
            files of ``NonFiniteGuard(dump_dir=...)``, or ``None``.
    """

    step: int
    tensor: str
    layer: str
    kind: str
    pass_: str
    nan_count: int
    inf_count: int
    last_finite_step: object
    last_finite_norm: object
    last_summaries: dict
    non_finite: dict
    born_in: object = None
    born_at: object = None
    born_type: object = None
    born_path: object = None
    born_nan_count: object = None
    born_inf_count: object = None
    born_input_range: object = None
    born_inside: object = None
    born_step: object = None
    born_tape: object = None
    batch_index: object = None
    replayed: object = None
    replay_note: object = None
    reproduce: object = None

    def __str__(self):
        lines = [
            f"Non-finite values at step {self.step}: first in {self.pass_} order is "
            f"{self.kind} of {self.layer!r} ({self.tensor}) with {self.nan_count} NaN "
            f"and {self.inf_count} Inf."
        ]
        if self.last_finite_step is not None and self.last_finite_norm is not None:
            lines.append(
                f"On the last finite step ({self.last_finite_step}) its L2 norm was "
                f"{self.last_finite_norm:.6g}."
            )
        elif self.last_finite_step is not None:
            lines.append(f"The last finite step was {self.last_finite_step}.")
        others = [name for name in self.non_finite if name != self.tensor]
        if others:
            lines.append(f"Also non-finite on this step: {', '.join(others[:10])}"
                         + (" ..." if len(others) > 10 else "") + ".")
        from kgrad.replay import describe_birth

        return " ".join(lines + describe_birth(self))


class NonFiniteError(RuntimeError):
    """Raised by `kgrad.NonFiniteGuard(action="raise")`; ``.report`` says where.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> x = np.ones((4, 2), "float32"); x[2, 0] = np.nan
    >>> try:
    ...     model.fit(x, np.ones((4, 1)), batch_size=2, verbose=0, shuffle=False,
    ...               callbacks=[kgrad.NonFiniteGuard(action="raise")])
    ... except kgrad.NonFiniteError as error:
    ...     print(error.report.step, error.report.born_in, error.report.born_nan_count)
    1 data 1
    """

    def __init__(self, report):
        super().__init__(str(report))
        self.report = report


def split_name(tensor_name):
    """``"grad/dense_1"`` -> (``"grad"``, ``"dense_1"``)."""
    kind, _, layer = tensor_name.partition("/")
    return kind, layer


def _uses_loss_scaling(model):
    import keras

    return isinstance(getattr(model, "optimizer", None), keras.optimizers.LossScaleOptimizer)


def watched_tensors(config, model, probe, loss, prediction_gradient, gradients, weights, layers):
    """The ``(name, tensor)`` pairs to check, in forward then backward order.

    Args:
        config: The `kgrad.config.GuardConfig`.
        model: The trained model.
        probe: The step's `kgrad.ProbeResult`.
        loss: The (possibly scaled) training loss.
        prediction_gradient: ``fn() -> dJ/dŷ`` (structured like the
            prediction), or ``None`` if the model has no compiled loss.
        gradients: Weight gradients, in the order of ``weights``.
        weights: The trainable weights.
        layers: Names of the guarded layers, or ``None`` for every captured
            activation (the tape then captured only the guard's layers).

    Returns:
        ``(watched, on_trip_only)``: the pairs, and the names whose "tensor"
        is a zero-argument callable to call only on a tripped step (dJ/dŷ,
        when the weight gradients are checked every step).
    """
    watched = []
    captures = config.captures
    if captures("inputs") and probe.input is not None:
        inputs = taps.float_leaves(probe.input)
        watched += [(f"input/{name}", t) for name, t in zip(io_names(inputs, "input"), inputs)]
    activations = [
        (name, tensor)
        for name, tensor in probe.activations.items()
        if layers is None or _belongs_to(name, layers)
    ]
    if captures("activations"):
        watched += [(f"activation/{name}", tensor) for name, tensor in activations]
    watched.append(("loss/loss", loss))
    if config.ignore_loss_scale_skips and _uses_loss_scaling(model):
        # Inf gradients are the loss scaler's signal; it skips those steps.
        return watched, ()
    on_trip_only = []
    if captures("prediction_gradient") and prediction_gradient is not None:
        # dJ/dŷ has the prediction's structure (the tape has seen the model's call).
        names = io_names(probe.prediction, "output", getattr(model, "output_names", None))
        names = [f"pred_grad/{name}" for name in names]
        leaves = _leaves_once_per_graph(prediction_gradient)
        if captures("weight_gradients"):
            # A second loss evaluation and backward pass every step for a
            # tensor whose non-finite values reach the weight gradients.
            watched += [(name, lambda i=i: leaves()[i]) for i, name in enumerate(names)]
            on_trip_only = names
        else:
            watched += list(zip(names, leaves()))
    if captures("activation_gradients"):
        watched += [
            (f"grad/{name}", probe.gradients[name])
            for name, _ in reversed(activations)
            if probe.gradients[name] is not None  # unknown: see ProbeResult.gradients
        ]
    if captures("weight_gradients"):
        for weight, gradient in reversed(list(zip(weights, gradients))):
            if gradient is not None:
                path = weight.path.removeprefix(f"{model.name}/")
                watched.append((f"weight_grad/{path}", tf.convert_to_tensor(gradient)))
    return watched, tuple(on_trip_only)


def _leaves_once_per_graph(structure_fn):
    """``fn() -> flat leaves of structure_fn()``, computed once per graph.

    A ``tf.cond`` branch is a graph of its own: tensors made in one cannot be
    used in another, so each branch that asks computes them once.
    """
    cache = {}

    def leaves():
        graph = tf.compat.v1.get_default_graph()
        if graph not in cache:
            cache[graph] = tf.nest.flatten(structure_fn())
        return cache[graph]

    return leaves


def _belongs_to(name, layers):
    # Captured names are "<layer>", "<layer>#<call>" or "<layer>/<output>".
    return any(
        name == layer or name.startswith((f"{layer}#", f"{layer}/")) for layer in layers
    )


# For `kgrad.first_non_finite`, which lives beside the replay's locating function.
from kgrad.locate import first_non_finite  # noqa: E402,F401
