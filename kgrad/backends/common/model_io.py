"""A model's edges as every backend names them: weight paths and the names of float inputs.

Example:

>>> import keras
>>> model = keras.Sequential([keras.Input((2,), name="features"), keras.layers.Dense(1, name="out")],
...                          name="m")
>>> model_relative_path(model, model.weights[0]), float_input_names(model, keras.ops.ones((1, 2)))
('out/kernel', ['features'])
"""

import keras


def model_relative_path(model, weight):
    """``weight.path`` without the model's own name, stable across re-runs."""
    prefix = f"{model.name}/"
    return weight.path[len(prefix) :] if weight.path.startswith(prefix) else weight.path


def float_input_names(model, x):
    """Names of the float leaves of ``x``: its dict keys, or the model's Input names (else ``None``)."""
    if x is None:
        return None
    leaves = keras.tree.flatten(x)
    if isinstance(x, dict):
        names = sorted(x)  # the order in which a dict flattens
    else:
        # Keras 3 models have no `input_names`; their Input tensors are named.
        names = [getattr(tensor, "name", None) for tensor in model_inputs(model)]
    if len(names) != len(leaves) or None in names:
        return None
    return [name for name, leaf in zip(names, leaves) if is_float(leaf)]


def is_float(value):
    """Whether ``value`` (a tensor or array of any backend) has a floating-point dtype."""
    dtype = getattr(value, "dtype", None)
    return dtype is not None and keras.backend.is_float_dtype(keras.backend.standardize_dtype(dtype))


def model_inputs(model):
    """The model's Input tensors, flat (none for a subclassed model)."""
    try:
        return keras.tree.flatten(model.inputs or [])
    except (AttributeError, ValueError):  # subclassed models have no inputs
        return []
