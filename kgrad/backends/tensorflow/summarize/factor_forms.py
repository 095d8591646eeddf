"""The three factored forms of per-example gradients, and what every layer's factors share.

``Outer(a, d)``, ``Explicit(g)`` and ``Lookup(ids, d, rows)`` are described in
`kgrad.backends.tensorflow.summarize._factors`; `pre_activation_gradient`
turns dJ/d(output) into dJ/d(pre-activation) for the activations a layer
applies itself.
"""

import collections

import keras
import tensorflow as tf

Outer = collections.namedtuple("Outer", ["a", "d"])
Explicit = collections.namedtuple("Explicit", ["g"])
Lookup = collections.namedtuple("Lookup", ["ids", "d", "rows"])


class Unsupported(Exception):
    """Raised with the reason why a layer's per-example gradient is not computed."""


def compute_dtype(tensor):
    """float64 stays float64; everything else (float16, bfloat16) is computed in float32."""
    return tf.float64 if tensor.dtype == tf.float64 else tf.float32


def cast(tensor, dtype):
    return tf.cast(tf.convert_to_tensor(tensor), dtype)


# dJ/dz from the output y = σ(z) and dJ/dy, for activations whose derivative
# is a function of y: no recomputation of z.
_FROM_OUTPUT = {
    # ReluGrad of the output: relu(z) > 0 exactly where z > 0 (one kernel,
    # a third of the time of a comparison and a select on CPU).
    keras.activations.relu: lambda y, d: tf.raw_ops.ReluGrad(gradients=d, features=y),
    keras.activations.tanh: lambda y, d: d * (1 - y * y),
    keras.activations.sigmoid: lambda y, d: d * y * (1 - y),
    keras.activations.softmax: lambda y, d: y * (d - tf.reduce_sum(y * d, axis=-1, keepdims=True)),
}


class _PreActivation:
    """Passed as a factor function's ``output``: its ``delta`` already is dJ/dz."""

    def __repr__(self):
        return "PRE_ACTIVATION"


#: ``output=PRE_ACTIVATION``: ``delta`` is dJ/d(pre-activation), e.g. the tape's
#: dJ/d(logits) of a softmax output (`kgrad.ProbeResult.logits_gradients`).
PRE_ACTIVATION = _PreActivation()


def pre_activation_gradient(layer, compute_z, output, delta):
    """dJ/dz from dJ/d(activation(z)): the recorded output is after the activation.

    Args:
        layer: The layer, for its ``activation``.
        compute_z: ``fn() -> z``, recomputing the pre-activation (one more
            forward product), called only when ``output`` cannot serve.
        output: The layer's recorded output, ``None``, or `PRE_ACTIVATION`.
        delta: dJ/d(output) (dJ/dz with `PRE_ACTIVATION`), in the compute dtype.
    """
    activation = getattr(layer, "activation", None)
    if output is PRE_ACTIVATION or activation is None or activation is keras.activations.linear:
        return delta
    if output is not None and activation in _FROM_OUTPUT:
        return _FROM_OUTPUT[activation](tf.cast(output, delta.dtype), delta)
    z = tf.cast(compute_z(), delta.dtype)
    # A vector-Jacobian product through the activation alone: exact for any
    # activation that acts on each example separately (elementwise, softmax).
    with tf.GradientTape() as tape:
        tape.watch(z)
        y = activation(z)
    return tape.gradient(y, z, output_gradients=tf.cast(delta, y.dtype))


def check_plain(layer):
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        raise Unsupported(
            f"{type(layer).__name__} with LoRA or quantization: not supported yet (its "
            "trainable weights are not the kernel the formula differentiates)."
        )


def rows_of(tensor):
    return tf.shape(tensor)[0]
