"""A model's edges in the pipeline: the summaries of dJ/dŷ, the names of float inputs, weight paths."""

import tensorflow as tf

from kgrad.backends.tensorflow.summarize import norms
from kgrad.plan.tag_names import io_names

# Shared with every backend; re-exported for the pipeline.
from kgrad.backends.common.model_io import float_input_names, model_inputs, model_relative_path  # noqa: F401,E402


def add_prediction_gradient(builder, model, gradient):
    if gradient is None:
        return
    gradients = tf.nest.flatten(gradient)
    names = io_names(gradient, "output", getattr(model, "output_names", None))
    for name, tensor in zip(names, gradients):
        builder.add_tensor("pred_grad", name, tensor)
        example = norms.example_norms(tensor)
        builder.add_scalar(f"pred_grad_example_norm_mean/{name}", tf.reduce_mean(example))
        builder.add_scalar(f"pred_grad_example_norm_max/{name}", norms.nan_max(example))
