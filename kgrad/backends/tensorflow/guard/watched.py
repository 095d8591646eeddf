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

import tensorflow as tf

from kgrad.backends.tensorflow.capture import taps
from kgrad.plan.tag_names import io_names

#: Key of the guard's flag in the outputs of a guarded train step; kgrad's
#: train function takes it out before Keras sees the logs.
TRIPPED_OUTPUT = "_kgrad_guard_tripped"


def _uses_loss_scaling(model):
    import keras

    return isinstance(getattr(model, "optimizer", None), keras.optimizers.LossScaleOptimizer)


def watched_tensors(config, model, probe, loss, prediction_gradient, gradients, weights, layers):
    """The ``(name, tensor)`` pairs to check, in forward then backward order.

    Args:
        config: The `kgrad.plan.options.GuardConfig`.
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
        # Inf gradients are the loss scaler's signal; it skips those steps. The spike rule
        # still judges the weight gradients: rows the guard never checks (`scaler_owned`).
        if config.spikes is not None:
            watched += _weight_gradients(model, gradients, weights)
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
        watched += _weight_gradients(model, gradients, weights)
    return watched, tuple(on_trip_only)


def scaler_owned(config, model, names):
    """The names among ``names`` whose NaN and Inf are the loss scaler's, not the guard's.

    With spike skipping under a ``LossScaleOptimizer`` (and ``ignore_loss_scale_skips``), the
    weight gradients are rows of the spike rule that no check trips on: scaled gradients that
    overflow are how the optimizer finds its scale; it skips that step's update itself, and
    the spike rule neither judges it nor lets it into its window.
    """
    if config.spikes is None or not (config.ignore_loss_scale_skips and _uses_loss_scaling(model)):
        return ()
    return tuple(name for name in names if name.startswith("weight_grad/"))


def _weight_gradients(model, gradients, weights):
    """``[(name, gradient)]`` of the weight gradients, last to first (backward order)."""
    watched = []
    for weight, gradient in reversed(list(zip(weights, gradients))):
        if gradient is not None:
            path = weight.path.removeprefix(f"{model.name}/")
            watched.append((f"weight_grad/{path}", tf.convert_to_tensor(gradient)))
    return watched


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
