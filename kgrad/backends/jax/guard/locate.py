"""Where a replayed JAX step's first NaN/Inf was born, from the counts of `kgrad.backends.jax.guard.trace`.

The same order and rules as TensorFlow's ``guard/locate.py``: non-finite
weights (an earlier update), then the data, then the forward pass (the first
call whose inputs are all finite and whose output is not), then the loss,
then the backward pass from the loss down (the first call whose dJ/d(input)
is non-finite while dJ/d(output) is finite), then the weight gradients.
Host code on NumPy values.
"""

import numpy as np
from keras import tree

from kgrad.backends.common.model_io import model_relative_path
from kgrad.plan import operations
from kgrad.plan.tag_names import io_names


def birth(born_in, name, kind, path, counts, input_range, **extra):
    """The ``born_*`` fields of a `kgrad.NonFiniteReport`."""
    return {
        "born_in": born_in, "born_at": name, "born_type": kind, "born_path": path,
        "born_nan_count": int(counts[0]), "born_inf_count": int(counts[1]), "born_input_range": input_range,
        **extra,
    }


def _float_arrays(structure):
    leaves = (np.asarray(leaf) for leaf in tree.flatten(structure) if hasattr(leaf, "dtype"))
    return [values for values in leaves if values.dtype.kind == "f" or values.dtype.name == "bfloat16"]


def _counts(structure):
    arrays = [values.astype(np.float64) for values in _float_arrays(structure)]
    return (sum(int(np.isnan(values).sum()) for values in arrays),
            sum(int(np.isinf(values).sum()) for values in arrays))


def _finite_range(structure):
    finite = [values.astype(np.float64).ravel() for values in _float_arrays(structure)]
    finite = np.concatenate([values[np.isfinite(values)] for values in finite]) if finite else np.zeros([0])
    return (float(finite.min()), float(finite.max())) if finite.size else None


def in_weights(model):
    """The first non-finite weight of ``model`` (an earlier update made it so), or ``None``."""
    for weight in model.weights:
        counts = _counts(weight.value)
        if any(counts):
            path = model_relative_path(model, weight)
            return birth("weights", path, "weight", path, counts, _finite_range(weight.value))
    return None


def in_data(inputs, targets, sample_weight):
    """The first non-finite input, target or sample weight (the NaN arrived with the data), or ``None``."""
    for structure, prefix in ((inputs, "input"), (targets, "target"), (sample_weight, "sample_weight")):
        if structure is None:
            continue
        leaves = tree.flatten(structure)
        names = io_names(structure, prefix)
        for name, leaf in zip(names, leaves):
            name = name if len(names) == 1 else f"{prefix}/{name}"
            counts = _counts(leaf)
            if any(counts):
                return birth("data", name, "input data", name, counts, _finite_range(leaf))
    return None


def describer(model):
    """``fn(operation name) -> (type, path)``: its class name and its longest path in nested models."""
    paths = {}
    for path, operation in operations.tappable_operations(model).items():
        if len(path) >= len(paths.get(id(operation), "")):
            paths[id(operation)] = path
    return lambda call: (type(call.operation).__name__, paths.get(id(call.operation), call.name))


def _range(values):
    """``(min, max)`` from the device's ``[min, max, any]``, or ``None``."""
    return (float(values[0]), float(values[1])) if values[2] else None


def in_forward(calls, arrays, describe):
    """The first call whose inputs are finite and whose output is not; else the loss; else ``None``."""
    carried = None
    for index, call in enumerate(calls):
        counts = arrays["outputs"][index]
        if not counts.any():
            continue
        kind, path = describe(call)
        if arrays["inputs"][index].any():
            carried = carried or (call.key, kind, path, counts, _range(arrays["ranges"][index]))
            continue  # it only carries a value born before it
        return birth("forward", call.key, kind, path, counts, _range(arrays["ranges"][index]))
    if carried is not None:
        return birth("forward", *carried, replay_note=(
            f"Its input was already non-finite: the value was born before {carried[0]!r}, in an operation "
            "that is not a layer or a keras.ops node of the model (a jax.numpy call inside a layer's call "
            "is named by the checkify line below, when it ran)."))
    if arrays["loss"].any():
        return birth("forward", "loss", "loss", "loss", arrays["loss"], _range(arrays["prediction_range"]),
                     replay_note="Every layer's output was finite: the loss made it (on JAX the replay does "
                                 "not split the loss into its terms: compiled loss, add_loss, regularizers).")
    return None


def _output_gradient(call, gradients):
    keys = [call.key] if call.key in gradients else [k for k in gradients if k.startswith(f"{call.key}/")]
    return np.sum([gradients[key] for key in keys], axis=0) if keys else np.zeros(2, np.int64)


def in_backward(calls, arrays, describe, weight_paths):
    """The call whose backward pass first turns a finite dJ/d(output) into a non-finite dJ/d(input)."""
    gradients = arrays["gradients"]
    for index in reversed(range(len(calls))):
        counts = _output_gradient(calls[index], gradients)
        if not counts.any():
            continue
        later = calls[index + 1:]
        # The call that took this output as input (seen while tracing), else the next one.
        consumer = next((call for call in later if calls[index].key in call.producers), None)
        consumer = consumer or (later[0] if later else None)
        if consumer is None:  # dJ/dŷ itself: the loss's backward pass
            return birth("backward", "loss", "loss", "loss", counts, _range(arrays["prediction_range"]))
        kind, path = describe(consumer)
        input_range = _range(arrays["ranges"][calls.index(consumer)])
        return birth("backward", consumer.key, kind, path, counts, input_range)
    input_counts = np.sum([value for key, value in gradients.items() if key.startswith("input:")] or
                          [np.zeros(2, np.int64)], axis=0)
    if input_counts.any() and calls:
        consumer = next((call for call in calls if "input" in call.producers), calls[0])
        kind, path = describe(consumer)
        return birth("backward", consumer.key, kind, path, input_counts,
                     _range(arrays["ranges"][calls.index(consumer)]))
    for path, counts in zip(weight_paths, arrays["weight_gradients"]):
        if counts.any():
            return birth("backward", path, "weight gradient", path, counts, None)
    return None
