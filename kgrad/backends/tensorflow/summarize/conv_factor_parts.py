"""Per-example gradients of Conv1D and Conv2D kernels, factored as patches times dJ/d(pre-activation).

The convolution's input is cut into the patches each output position sees
(``tf.image.extract_patches`` or strided slices), grouped as the layer
groups its channels: ``Outer(patches, d)`` (see `kgrad.backends.tensorflow.summarize._factors`).
"""

import keras
import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.tensorflow.summarize.factor_forms import (
    Explicit,
    Outer,
    Unsupported,
    cast,
    check_plain,
    pre_activation_gradient,
    rows_of,
)


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
            keras.ops.pad(a, keras_internals.causal_padding(layer)), kernel, strides=list(layer.strides),
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
    check_plain(layer)
    if layer.rank not in (1, 2):
        raise Unsupported(f"{type(layer).__name__}: only 1-D and 2-D convolutions are supported yet.")
    d = pre_activation_gradient(layer, lambda: _convolve(layer, a), output, delta)
    if layer.data_format == "channels_first":
        d = tf.transpose(d, [0] + list(range(2, layer.rank + 2)) + [1])
    image, sizes, strides, rates, padding = _conv_geometry(layer, cast(a, d.dtype))
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
    rows, groups = rows_of(image), layer.groups
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
