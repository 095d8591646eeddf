"""L2 norms on device, exact at any magnitude, NaN or Inf when an element is.

A norm read alone must not look finite when its tensor is not, so these are
the norms of *every* element (as ``tf.norm``'s), unlike the mean, std, min
and max of `kgrad.backends.tensorflow.summarize.stats`, which are of the finite elements. Squares of
exploding gradients (|g| > 1e19) overflow float32: where that can happen the
tensor is divided by its largest magnitude first.
"""

import tensorflow as tf


def sum_of_squares(x):
    """``sum(x²)`` in float32, in one pass over ``x`` with no temporary.

    ``tf.nn.l2_loss`` is one fused kernel; ``reduce_sum(square(x))`` is two
    passes and a tensor the size of ``x``.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize import norms
    >>> float(norms.sum_of_squares(tf.constant([3.0, 4.0])))
    25.0
    """
    return 2.0 * tf.nn.l2_loss(tf.cast(x, tf.float32))


def l2_norm(x):
    """The L2 norm of all of ``x``, in float32, in one pass (see `sum_of_squares`).

    Example:

    >>> import tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize import norms
    >>> float(norms.l2_norm(tf.constant([[3.0], [4.0]])))
    5.0
    """
    return tf.sqrt(sum_of_squares(x))


def norms_many(tensors):
    """The L2 norm of each of ``tensors``, exact at any magnitude: a ``[n]`` float32 vector.

    What a probed step needs of a tensor when only its norm is written (a
    bias's gradient, which only enters the global norm; a kernel's gradient
    without its histogram): one fused kernel per tensor (`sum_of_squares`),
    against the five reductions of `kgrad.backends.tensorflow.summarize.stats.summarize_many`. Only when a
    sum of squares is not finite (a NaN or Inf, or squares beyond float32)
    does one branch for the whole call rescale each tensor by its largest
    magnitude.

    Args:
        tensors: A list of tensors of any float dtype and shape.

    Returns:
        The norms: NaN for a tensor holding a NaN, else Inf for one holding
        an Inf (as `kgrad.backends.tensorflow.summarize.stats.summarize_many`'s norm column), 0 for an
        empty tensor.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize import norms
    >>> result = norms.norms_many([tf.constant([3.0, 4.0]), tf.constant([3e30, 4e30])])
    >>> [f"{value:.4g}" for value in result.numpy()]  # 3e30² is beyond float32
    ['5', '5e+30']
    """
    if not tensors:
        return tf.zeros([0])
    flat = [tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors]
    squares = 2.0 * tf.stack([tf.nn.l2_loss(values) for values in flat])
    return tf.cond(
        tf.reduce_all(tf.math.is_finite(squares)),
        lambda: tf.sqrt(squares),
        lambda: tf.stack([_norm(values) for values in flat]),
    )


def example_norms(x):
    """L2 norm of each example (row) of ``x``; a ``[batch]`` float32 tensor.

    Exact also for gradients too large to square in float32.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize import norms
    >>> norms.example_norms(tf.constant([[3.0, 4.0], [0.0, 1.0]])).numpy().tolist()
    [5.0, 1.0]
    """
    x = tf.cast(x, tf.float32)
    batch = tf.shape(x)[0]
    return _norm(tf.reshape(x, [batch, -1]), axis=1)


def global_norm(tensors):
    """The L2 norm of all ``tensors`` taken together, in float32.

    Args:
        tensors: A list of tensors of any float dtype and shape.

    Returns:
        A float32 scalar, ``sqrt(sum of all squares)``; 0 for an empty list,
        Inf or NaN when an element is.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize import norms
    >>> float(norms.global_norm([tf.constant([3.0]), tf.constant([[4.0]])]))
    5.0
    """
    if not tensors:
        return tf.constant(0.0)
    each = [_norm(tf.reshape(tf.cast(t, tf.float32), [-1])) for t in tensors]
    return _norm(tf.stack(each))


def combined_norm(tensor_norms):
    """`global_norm` of tensors from their own norms, without another pass.

    Args:
        tensor_norms: Float32 scalars (a list or a vector), the L2 norm of each
            tensor (`norms_many`, or a row of `kgrad.backends.tensorflow.summarize.stats.moments`: NaN or
            Inf when the tensor holds one).

    Returns:
        A float32 scalar: 0 for no norms, NaN when a norm is NaN, else Inf
        when one is Inf, as `global_norm` of the tensors themselves.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize import norms
    >>> tensors = [tf.constant([3.0]), tf.constant([[4.0]])]
    >>> float(norms.combined_norm(norms.norms_many(tensors)))
    5.0
    """
    tensor_norms = tf.reshape(tf.convert_to_tensor(tensor_norms, tf.float32), [-1])
    # `_norm` rescales by the largest norm, so that norms beyond 1e19 still
    # combine; a NaN or Inf is left to propagate.
    return _norm(tensor_norms)


def _safe_scale(values, axis=None):
    # Dividing by the largest magnitude first keeps norms finite; Inf and NaN
    # are left to propagate as they would without scaling.
    scale = tf.reduce_max(tf.abs(values), axis=axis, keepdims=axis is not None)
    usable = tf.logical_and(scale > 0, tf.math.is_finite(scale))
    return tf.where(usable, scale, tf.ones_like(scale))


def _norm(x, axis=None):
    scale = _safe_scale(x, axis)
    norm = tf.norm(x / scale, axis=axis, keepdims=axis is not None) * scale
    return norm if axis is None else tf.squeeze(norm, axis)
