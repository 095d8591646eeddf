"""L2 norms written once for every backend with ``keras.ops``: exact at any magnitude, NaN or Inf
when an element is.

A norm read alone must not look finite when its tensor is not, so these are
the norms of *every* element. Squares of exploding gradients (|g| > 1e19)
overflow float32: the values are divided by their largest magnitude first.

Measured against the TensorFlow kernels they replace (``python -m benchmarks.keras_ops_norms``,
median CPU-time ratio keras.ops / TensorFlow over 11 interleaved pairs, 2-core CPU, 2026-12-04):
`example_norms` of a ``[256, 16384]`` gradient 1.00 (1.00 under XLA), `combined_norm`
of 2000 norms 0.83 (0.73 under XLA). A plain sum of squares is not here:
``keras.ops`` has no fused ``l2_loss``, and ``sum(square(x))`` of 4M floats took
2.13x TensorFlow's one kernel without XLA (1.00 with), so each backend keeps its
own.
"""

from keras import ops

#: A plain float32 sum of squares of n elements is exact to float32 rounding when it is at least
#: ``n * TINY_SQUARES``: the squares flushed to 0 (|x| < 2**-63, below float32's smallest normal once
#: squared) then weigh at most 2**-26 of it. Below, a tensor that is not all zeros is rescaled first:
#: a gradient that vanished to 1e-22 would read a norm of 0. Both backends' fast paths check it.
TINY_SQUARES = 2.0**-100


def squares_are_exact(squares, size, largest=None):
    """Whether plain float32 sums of squares are their tensors' to float32 rounding (`TINY_SQUARES`).

    Finite, and at least ``size * TINY_SQUARES``, or of a tensor whose
    ``largest`` magnitude is 0 (``None``: not known, so a sum of 0 is not
    taken as exact). Elementwise over vectors of tensors.

    Example:

    >>> import numpy as np
    >>> [bool(v) for v in squares_are_exact(np.array([25.0, 0.0, 0.0]), 2, np.array([4.0, 1e-22, 0.0]))]
    [True, False, True]
    """
    enough = squares >= size * TINY_SQUARES
    if largest is not None:
        enough = ops.logical_or(enough, largest == 0)
    return ops.logical_and(ops.isfinite(squares), enough)


def safe_norm(x, axis=None):
    """The L2 norm of ``x`` (over ``axis``), rescaled by its largest magnitude: huge values do not overflow.

    Example:

    >>> import numpy as np
    >>> f"{float(safe_norm(np.array([3e30, 4e30], 'float32'))):.4g}"  # 3e30² is beyond float32
    '5e+30'
    """
    # initial=0: an empty tensor has norm 0 (its max would be an error).
    scale = ops.max(ops.abs(x), axis=axis, keepdims=axis is not None, initial=0.0)
    # Inf and NaN are left to propagate as they would without scaling.
    usable = ops.logical_and(scale > 0, ops.isfinite(scale))
    scale = ops.where(usable, scale, ops.ones_like(scale))
    norm = ops.sqrt(ops.sum(ops.square(x / scale), axis=axis, keepdims=axis is not None)) * scale
    return norm if axis is None else ops.squeeze(norm, axis)


def example_norms(x):
    """L2 norm of each example (row) of ``x``: a ``[batch]`` float32 tensor, exact for huge gradients.

    Example:

    >>> import numpy as np
    >>> [float(v) for v in example_norms(np.array([[3.0, 4.0], [0.0, 1.0]], "float32"))]
    [5.0, 1.0]
    """
    x = ops.cast(x, "float32")
    if len(x.shape) < 2:
        return safe_norm(ops.reshape(x, (ops.shape(x)[0], -1)), axis=1)
    # Over the example's own axes, not flattened: a tensor split over devices (JAX's
    # ModelParallel) is reduced where it lives, where a reshape would gather it.
    return safe_norm(x, axis=tuple(range(1, len(x.shape))))


def global_norm(tensors):
    """The L2 norm of all ``tensors`` taken together, in float32: 0 for none, Inf or NaN when an element is.

    Example:

    >>> import numpy as np
    >>> float(global_norm([np.array([3.0], "float32"), np.array([[4.0]], "float32")]))
    5.0
    """
    if not tensors:
        return ops.convert_to_tensor(0.0, "float32")
    each = [safe_norm(ops.reshape(ops.cast(tensor, "float32"), (-1,))) for tensor in tensors]
    return safe_norm(ops.stack(each))


def combined_norm(tensor_norms):
    """`global_norm` of tensors from their own norms, without another pass over them.

    Args:
        tensor_norms: Float32 scalars (a list or a vector), the L2 norm of each
            tensor (NaN or Inf when the tensor holds one).

    Returns:
        A float32 scalar: 0 for no norms, NaN when a norm is NaN, else Inf
        when one is Inf, as `global_norm` of the tensors themselves.

    Example:

    >>> float(combined_norm([3.0, 4.0]))
    5.0
    """
    if isinstance(tensor_norms, (list, tuple)):
        if not tensor_norms:
            return ops.convert_to_tensor(0.0, "float32")
        tensor_norms = ops.stack([ops.cast(norm, "float32") for norm in tensor_norms])
    # Rescaled by the largest norm, so that norms beyond 1e19 still combine.
    return safe_norm(ops.reshape(ops.cast(tensor_norms, "float32"), (-1,)))


def nan_max(x, axis=None):
    """``ops.max(x, axis)``, NaN wherever an element is NaN, on every backend and compiler.

    A maximum kgrad reports must not look finite when its values are not, and
    two compilers drop a NaN from a max: TensorFlow compiles ``reduce_max`` for
    XLA with fast min/max (``tf.reduce_max([1, nan, 3])`` is 3.0 with
    ``jit_compile=True``), and on JAX under a `keras.distribution` the
    all-reduce combining the devices' maxima drops it.

    Example:

    >>> import numpy as np
    >>> float(nan_max(np.array([1.0, np.nan, 3.0], "float32")))
    nan
    """
    return ops.where(ops.any(ops.isnan(x), axis=axis), float("nan"), ops.max(x, axis=axis))
