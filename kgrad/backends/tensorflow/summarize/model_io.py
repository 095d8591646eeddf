"""A model's edges in the pipeline: the summaries of dJ/dŷ, the names of float inputs, weight paths."""

import tensorflow as tf

from kgrad.backends.tensorflow.summarize import norms
from kgrad.plan.tag_names import io_names


def model_relative_path(model, weight):
    """``weight.path`` without the model's own name, stable across re-runs."""
    prefix = f"{model.name}/"
    return weight.path[len(prefix) :] if weight.path.startswith(prefix) else weight.path


def add_prediction_gradient(builder, model, gradient):
    if gradient is None:
        return
    gradients = tf.nest.flatten(gradient)
    names = io_names(gradient, "output", getattr(model, "output_names", None))
    for name, tensor in zip(names, gradients):
        builder.add_tensor("pred_grad", name, tensor)
        example = norms.example_norms(tensor)
        builder.add_scalar(f"pred_grad_example_norm_mean/{name}", tf.reduce_mean(example))
        builder.add_scalar(f"pred_grad_example_norm_max/{name}", tf.reduce_max(example))


def float_input_names(model, x):
    """Names of the float leaves of ``x``: its dict keys, or the model's Input names."""
    if x is None:
        return None
    leaves = tf.nest.flatten(x)
    if isinstance(x, dict):
        names = sorted(x)  # the order in which tf.nest flattens a dict
    else:
        # Keras 3 models have no `input_names`; their Input tensors are named.
        names = [getattr(tensor, "name", None) for tensor in model_inputs(model)]
    if len(names) != len(leaves) or None in names:
        return None
    return [
        name
        for name, leaf in zip(names, leaves)
        if getattr(leaf, "dtype", None) is not None and tf.as_dtype(leaf.dtype).is_floating
    ]


def model_inputs(model):
    try:
        return tf.nest.flatten(model.inputs or [])
    except (AttributeError, ValueError):  # subclassed models have no inputs
        return []
