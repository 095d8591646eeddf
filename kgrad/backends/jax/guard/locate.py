"""The JAX replay's account of its calls, for the NaN-birth rules of `kgrad.backends.common.locate`.

`kgrad.backends.jax.guard.trace` counts, on the device, the NaN/Inf of each
recorded call's inputs, output and dJ/d(output); `located` describes those
calls as `kgrad.backends.common.locate.Call`s and applies the rules, the same
as TensorFlow's. `before_the_pass` checks what needs no pass: the weights and
the data.
"""

import numpy as np

from kgrad.backends.common import locate
from kgrad.backends.common.model_io import model_relative_path
from kgrad.plan import operations

#: How the replay names an operation it does not record (`locate.in_forward`).
_UNSEEN = (
    "that is not a layer or a keras.ops node of the model (a jax.numpy call inside a layer's call "
    "is named by the checkify line below, when it ran)"
)
_LOSS_NOTE = (
    "Every layer's output was finite: the loss made it (on JAX the replay does not split the loss into "
    "its terms: compiled loss, add_loss, regularizers)."
)


def before_the_pass(model, inputs, targets, sample_weight):
    """The birth in ``model``'s weights (an earlier update) or in the data, or ``None``."""
    weights = [(model_relative_path(model, weight), weight.value) for weight in model.weights]
    return locate.in_weights(weights) or locate.in_data(inputs, targets, sample_weight)


def located(model, calls, arrays, weight_paths):
    """The birth in the forward or backward pass of a replay (`trace.replayed_pass`), or ``None``."""
    paths = {}
    for path, operation in operations.tappable_operations(model).items():
        if len(path) >= len(paths.get(id(operation), "")):  # its longest path in nested models
            paths[id(operation)] = path
    gradients = arrays["gradients"]
    described = [
        locate.Call(
            call.key, type(call.operation).__name__, paths.get(id(call.operation), call.name),
            output=arrays["outputs"][index], inputs=arrays["inputs"][index],
            input_range=_range(arrays["ranges"][index]), output_gradient=_output_gradient(call, gradients),
            takes=tuple(call.producers),
        )
        for index, call in enumerate(calls)
    ]
    prediction_range = _range(arrays["prediction_range"])
    inputs = [value for key, value in gradients.items() if key.startswith("input:")]
    return locate.in_forward(
        described, locate.Loss(arrays["loss"], note=_LOSS_NOTE), prediction_range, _UNSEEN
    ) or locate.in_backward(
        described, prediction_range, np.sum(inputs or [np.zeros(2, np.int64)], axis=0),
        list(zip(weight_paths, arrays["weight_gradients"])),
    )


def _range(values):
    """``(min, max)`` from the device's ``[min, max, any]``, or ``None``."""
    return (float(values[0]), float(values[1])) if values[2] else None


def _output_gradient(call, gradients):
    keys = [call.key] if call.key in gradients else [k for k in gradients if k.startswith(f"{call.key}/")]
    return np.sum([gradients[key] for key in keys], axis=0) if keys else np.zeros(2, np.int64)
