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


def _cast(tensor, dtype):
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


def _pre_activation_gradient(layer, compute_z, output, delta):
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


def _check_plain(layer):
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        raise Unsupported(
            f"{type(layer).__name__} with LoRA or quantization: not supported yet (its "
            "trainable weights are not the kernel the formula differentiates)."
        )


def _rows(tensor):
    return tf.shape(tensor)[0]


def dense_factors(layer, a, delta, output=None):
    """`Dense`: ``a @ kernel (+ bias)``; extra axes of ``a`` are positions."""
    _check_plain(layer)

    def compute_z():
        z = tf.matmul(a, tf.cast(layer.kernel, a.dtype))
        return z if layer.bias is None else z + tf.cast(layer.bias, a.dtype)

    d = _pre_activation_gradient(layer, compute_z, output, delta)
    dtype = d.dtype
    rows, units = _rows(a), d.shape[-1]
    a = tf.reshape(_cast(a, dtype), [rows, -1, 1, a.shape[-1]])
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
    _check_plain(layer)
    x, out, batch, positions, shared, contracted, produced = _einsum_parts(layer.equation)

    def compute_z():
        z = tf.einsum(layer.equation, a, tf.cast(layer.kernel, a.dtype))
        return z if layer.bias is None else z + tf.cast(layer.bias, a.dtype)

    d = _pre_activation_gradient(layer, compute_z, output, delta)
    dtype, rows = d.dtype, _rows(a)
    size = {c: a.shape[x.index(c)] for c in x[1:]}
    size.update({c: d.shape[out.index(c)] for c in out[1:]})
    # Input indices in neither the kernel nor the output are summed first.
    a_part = tf.einsum(f"{x}->{batch}{positions}{shared}{contracted}", _cast(a, dtype))
    d_part = tf.einsum(f"{out}->{batch}{positions}{shared}{produced}", d)
    groups = [[size[c] for c in part] for part in (positions, shared)]
    a_part = _flatten_to(a_part, rows, groups + [[size[c] for c in contracted]])
    d_part = _flatten_to(d_part, rows, groups + [[size[c] for c in produced]])
    factors = {"kernel": Outer(a_part, d_part)}
    if layer.bias is not None:
        bias_axes = "".join(c for c in out if c in (layer.bias_axes or ""))
        factors["bias"] = Explicit(tf.einsum(f"{out}->{batch}{bias_axes}", d))
    return factors


def _conv_geometry(layer, a):
    """Channels-last 2-D view of a Conv1D/Conv2D input: (a, sizes, strides, rates, padding)."""
    if layer.data_format == "channels_first":
        a = tf.transpose(a, [0] + list(range(2, layer.rank + 2)) + [1])
    sizes, strides, rates = list(layer.kernel_size), list(layer.strides), list(layer.dilation_rate)
    padding = layer.padding
    if layer.rank == 1:
        if padding == "causal":
            # Causal: left padding by the dilated kernel's reach, then "valid".
            a = tf.pad(a, [[0, 0], [rates[0] * (sizes[0] - 1), 0], [0, 0]])
            padding = "valid"
        a = a[:, tf.newaxis]
        sizes, strides, rates = [1] + sizes, [1] + strides, [1] + rates
    return a, sizes, strides, rates, padding.upper()


def _convolve(layer, a):
    """The layer's convolution of ``a`` plus bias, before the activation, as its call does it."""
    kernel = tf.cast(layer.kernel, a.dtype)
    if layer.padding != "causal":
        z = layer.convolution_op(a, kernel)
    else:
        z = keras.ops.conv(
            keras.ops.pad(a, layer._compute_causal_padding()), kernel, strides=list(layer.strides),
            padding="valid", dilation_rate=list(layer.dilation_rate), data_format=layer.data_format,
        )
    if not layer.use_bias:
        return z
    shape = [1] * (layer.rank + 2)
    shape[-1 if layer.data_format == "channels_last" else 1] = layer.filters
    return z + tf.reshape(tf.cast(layer.bias, a.dtype), shape)


def conv_factors(layer, a, delta, output=None, method=None):
    """`Conv1D` / `Conv2D`: ``Outer`` of the input's patches and dJ/d(pre-activation).

    The patches are built from one strided slice of the padded input per
    kernel offset, concatenated (``"slices"``): on CPU, 2-4x faster than
    `tf.image.extract_patches`, which is kept for inputs whose spatial size
    is not static (``"extract"``). ``method`` forces one, for tests.
    """
    _check_plain(layer)
    if layer.rank not in (1, 2):
        raise Unsupported(f"{type(layer).__name__}: only 1-D and 2-D convolutions are supported yet.")
    d = _pre_activation_gradient(layer, lambda: _convolve(layer, a), output, delta)
    if layer.data_format == "channels_first":
        d = tf.transpose(d, [0] + list(range(2, layer.rank + 2)) + [1])
    image, sizes, strides, rates, padding = _conv_geometry(layer, _cast(a, d.dtype))
    if layer.rank == 1:
        d = d[:, tf.newaxis]  # as the image: [B, 1, L, F]
    if method is None:
        method = "slices" if None not in image.shape[1:] and None not in d.shape[1:3] else "extract"
    if method == "slices":
        patches = _patches_from_slices(image, d.shape[1:3], sizes, strides, rates, padding)
    else:
        patches = tf.image.extract_patches(
            image, [1, *sizes, 1], [1, *strides, 1], [1, *rates, 1], padding=padding
        )
    factors = {"kernel": _grouped_outer(layer, image, patches, d, sizes)}
    if layer.use_bias:
        factors["bias"] = Explicit(tf.reduce_sum(d, axis=[1, 2]))
    return factors


def _patches_from_slices(image, out_sizes, sizes, strides, rates, padding):
    """As `tf.image.extract_patches`: ``[B, H', W', kh·kw·C]``, laid out (kh, kw, C)."""
    if padding == "SAME":
        pads = [
            max((out - 1) * stride + (size - 1) * rate + 1 - extent, 0)
            for out, stride, size, rate, extent in zip(out_sizes, strides, sizes, rates, image.shape[1:3])
        ]
        image = tf.pad(image, [[0, 0], [pads[0] // 2, pads[0] - pads[0] // 2],
                               [pads[1] // 2, pads[1] - pads[1] // 2], [0, 0]])
    seen = [
        image[
            :,
            u * rates[0] : u * rates[0] + (out_sizes[0] - 1) * strides[0] + 1 : strides[0],
            v * rates[1] : v * rates[1] + (out_sizes[1] - 1) * strides[1] + 1 : strides[1],
        ]
        for u in range(sizes[0])
        for v in range(sizes[1])
    ]
    return tf.concat(seen, axis=-1)


def _grouped_outer(layer, image, patches, d, sizes):
    """``Outer`` of the patches and ``d``, one group of channels per ``m``."""
    rows, groups = _rows(image), layer.groups
    channels, filters = image.shape[-1], layer.filters
    # A patch is laid out (kh, kw, channels) like the kernel; channels are
    # group-major, and so are the filters.
    per_group = sizes[0] * sizes[1] * (channels // groups)
    if groups == 1:
        patches = tf.reshape(patches, [rows, -1, 1, per_group])  # no copy
    else:
        patches = tf.reshape(patches, [rows, -1, sizes[0] * sizes[1], groups, channels // groups])
        patches = tf.reshape(tf.transpose(patches, [0, 1, 3, 2, 4]), [rows, -1, groups, per_group])
    return Outer(patches, tf.reshape(d, [rows, -1, groups, filters // groups]))


def embedding_factors(layer, ids, delta, output=None):
    """`Embedding`: the rows looked up, each example's positions grouped by id."""
    _check_plain(layer)
    rows = _rows(delta)
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
    x = _cast(a, dtype)
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
        ((keras.layers.Conv1D, keras.layers.Conv2D), conv_factors),
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

