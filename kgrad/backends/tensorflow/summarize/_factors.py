"""Per-example gradients of a layer's weights in factored form, per layer type.

For each supported layer, one call's input ``a`` and dJ/d(pre-activation)
``δ`` are rearranged into one of three forms that `kgrad.backends.tensorflow.summarize.per_example`
reduces to squared norms:

- ``Outer(a, d)``: ``a`` is ``[B, P, M, K]`` and ``d`` is ``[B, P, M, N]``;
  example i's gradient is ``g_i[m, k, n] = Σ_p a[i, p, m, k] d[i, p, m, n]``
  (Dense, EinsumDense, Conv: P runs over positions / patches, M over groups).
- ``Explicit(g)``: the per-example gradients ``g`` themselves, ``[B, ...]``
  (biases, LayerNormalization: small).
- ``Lookup(ids, d, rows)``: an Embedding; example i's gradient has row k equal
  to ``Σ_{t: ids[i, t] = k} d[i, t]``.

References: Goodfellow 2015, "Efficient per-example gradient computations";
BackPACK's BatchL2Grad (Dangel et al. 2020).
"""

import keras
import tensorflow as tf

from kgrad.backends.tensorflow.summarize import conv_factor_parts
from kgrad.backends.tensorflow.summarize.factor_forms import (
    PRE_ACTIVATION,  # noqa: F401 (the factors' own marker, read by per_example)
    Explicit,
    Lookup,
    Outer,
    Unsupported,
    cast,
    check_plain,
    compute_dtype,
    pre_activation_gradient,
    rows_of,
)

def dense_factors(layer, a, delta, output=None):
    """`Dense`: ``a @ kernel (+ bias)``; extra axes of ``a`` are positions."""
    check_plain(layer)

    def compute_z():
        z = tf.matmul(a, tf.cast(layer.kernel, a.dtype))
        return z if layer.bias is None else z + tf.cast(layer.bias, a.dtype)

    d = pre_activation_gradient(layer, compute_z, output, delta)
    dtype = d.dtype
    rows, units = rows_of(a), d.shape[-1]
    a = tf.reshape(cast(a, dtype), [rows, -1, 1, a.shape[-1]])
    d = tf.reshape(d, [rows, -1, 1, units])
    factors = {"kernel": Outer(a, d)}
    if layer.bias is not None:
        factors["bias"] = Explicit(tf.reduce_sum(d, axis=[1, 2]))
    return factors


def _einsum_parts(equation):
    """Splits ``"X,Y->Z"`` into index groups (see `einsum_dense_factors`)."""
    if "..." in equation or "->" not in equation or "," not in equation:
        raise Unsupported(f"EinsumDense equation {equation!r}: only 'X,Y->Z' without '...' is supported yet.")
    inputs, output = equation.split("->")
    x, y = inputs.split(",")
    batch = x[0]
    if output[:1] != batch or batch in y:
        raise Unsupported(
            f"EinsumDense equation {equation!r}: the first input index must be the batch, "
            "first in the output too and absent from the kernel."
        )
    if any(char not in x and char not in output for char in y):
        raise Unsupported(
            f"EinsumDense equation {equation!r}: kernel indices summed over: not supported yet."
        )
    positions = "".join(c for c in x[1:] if c in output and c not in y)
    shared = "".join(c for c in y if c in x and c in output)
    contracted = "".join(c for c in y if c in x and c not in output)
    produced = "".join(c for c in y if c in output and c not in x)
    return x, output, batch, positions, shared, contracted, produced


def _flatten_to(tensor, rows, groups):
    """Reshapes ``[B, *groups]`` (static sizes) into ``[B, prod(g) for g in groups]``."""
    shape = [rows]
    for sizes in groups:
        total = 1
        for size in sizes:
            total *= size
        shape.append(total)
    return tf.reshape(tensor, shape)


def einsum_dense_factors(layer, a, delta, output=None):
    """`EinsumDense` (``MultiHeadAttention``'s projections), from its equation.

    Output indices that are also input indices but not kernel indices are
    positions (summed in the gradient); kernel indices shared by the input and
    the output (rare) are groups; the others split into contracted and
    produced ones.
    """
    check_plain(layer)
    x, out, batch, positions, shared, contracted, produced = _einsum_parts(layer.equation)

    def compute_z():
        z = tf.einsum(layer.equation, a, tf.cast(layer.kernel, a.dtype))
        return z if layer.bias is None else z + tf.cast(layer.bias, a.dtype)

    d = pre_activation_gradient(layer, compute_z, output, delta)
    dtype, rows = d.dtype, rows_of(a)
    size = {c: a.shape[x.index(c)] for c in x[1:]}
    size.update({c: d.shape[out.index(c)] for c in out[1:]})
    # Input indices in neither the kernel nor the output are summed first.
    a_part = tf.einsum(f"{x}->{batch}{positions}{shared}{contracted}", cast(a, dtype))
    d_part = tf.einsum(f"{out}->{batch}{positions}{shared}{produced}", d)
    groups = [[size[c] for c in part] for part in (positions, shared)]
    a_part = _flatten_to(a_part, rows, groups + [[size[c] for c in contracted]])
    d_part = _flatten_to(d_part, rows, groups + [[size[c] for c in produced]])
    factors = {"kernel": Outer(a_part, d_part)}
    if layer.bias is not None:
        bias_axes = "".join(c for c in out if c in (layer.bias_axes or ""))
        factors["bias"] = Explicit(tf.einsum(f"{out}->{batch}{bias_axes}", d))
    return factors


def embedding_factors(layer, ids, delta, output=None):
    """`Embedding`: the rows looked up, each example's positions grouped by id."""
    check_plain(layer)
    rows = rows_of(delta)
    ids = tf.reshape(tf.cast(ids, tf.int32), [rows, -1])
    d = tf.reshape(delta, [rows, -1, layer.output_dim])
    return {"embeddings": Lookup(ids, d, layer.input_dim)}


def layer_normalization_factors(layer, a, delta, output=None):
    """`LayerNormalization`: gamma from x̂ ⊙ δ, beta from δ, summed over positions."""
    if layer.rms_scaling:
        raise Unsupported("LayerNormalization(rms_scaling=True): not supported yet.")
    rank = a.shape.rank
    axes = sorted(axis % rank for axis in ([layer.axis] if isinstance(layer.axis, int) else layer.axis))
    if 0 in axes:
        raise Unsupported(
            "LayerNormalization over the batch axis couples the examples: a per-example "
            "gradient is not defined."
        )
    dtype = compute_dtype(delta)
    x = cast(a, dtype)
    mean, variance = tf.nn.moments(x, axes=axes, keepdims=True)
    normalized = (x - mean) * tf.math.rsqrt(variance + tf.cast(layer.epsilon, dtype))
    summed = [axis for axis in range(1, rank) if axis not in axes]
    factors = {}
    if layer.scale:
        factors["gamma"] = Explicit(tf.reduce_sum(normalized * delta, axis=summed))
    if layer.center:
        factors["beta"] = Explicit(tf.reduce_sum(delta, axis=summed))
    return factors


def factors_for(layer, a, delta, output=None):
    """The factored per-example gradients of one call, by weight attribute name.

    ``output`` (the call's recorded output, optional) spares recomputing the
    pre-activation for ReLU, tanh, sigmoid and softmax; `PRE_ACTIVATION` says
    that ``delta`` is dJ/d(pre-activation) already.

    Raises:
        Unsupported: With the reason, for layers not supported or not defined.
    """
    if isinstance(layer, keras.layers.BatchNormalization):
        raise Unsupported(
            "BatchNormalization in training mode normalizes with the batch's statistics, "
            "so each example's loss depends on every example: a per-example gradient is "
            "not defined."
        )
    kinds = [
        (keras.layers.Dense, dense_factors),
        (keras.layers.EinsumDense, einsum_dense_factors),
        ((keras.layers.Conv1D, keras.layers.Conv2D), conv_factor_parts.conv_factors),
        (keras.layers.Embedding, embedding_factors),
        (keras.layers.LayerNormalization, layer_normalization_factors),
    ]
    for kind, factors in kinds:
        # Exact types: subclasses (Conv2DTranspose is not one, a user's may be) can
        # compute something else in their call.
        classes = kind if isinstance(kind, tuple) else (kind,)
        if type(layer) in classes:
            return factors(layer, a, delta, output)
    raise Unsupported(
        f"{type(layer).__name__}: per-example gradient norms are not supported yet "
        "(supported: Dense, EinsumDense, Conv1D, Conv2D, Embedding, LayerNormalization)."
    )

