"""Pure on-device summaries of a tensor, all compilable by XLA.

Every function takes tensors and returns tensors; nothing here reads values to
the host, writes files or keeps state. Statistics are computed in float32 over
the *finite* elements; non-finite elements are counted separately, so a single
NaN does not hide the shape of the rest of the distribution.
"""

import tensorflow as tf

#: Names of the values returned by `moments`, in order.
MOMENT_NAMES = ("norm", "mean", "std", "min", "max", "zero_fraction", "nonfinite")


def _finite_parts(x):
    x = tf.cast(tf.reshape(x, [-1]), tf.float32)
    finite = tf.math.is_finite(x)
    return tf.where(finite, x, tf.zeros_like(x)), finite


def moments(x):
    """Summary statistics of ``x`` as a float32 vector of `MOMENT_NAMES`.

    Args:
        x: A tensor of any float dtype and shape.

    Returns:
        A ``[7]`` float32 tensor: L2 norm, mean, standard deviation, min and max
        of the finite elements, fraction of elements exactly zero, and the count
        of non-finite (NaN or Inf) elements. Min and max are 0 when there is no
        finite element.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> [round(float(v), 3) for v in stats.moments(tf.constant([0.0, 3.0, 4.0]))]
    [5.0, 2.333, 1.7, 0.0, 4.0, 0.333, 0.0]
    """
    values, finite = _finite_parts(x)
    total = tf.cast(tf.size(values), tf.float32)
    count = tf.reduce_sum(tf.cast(finite, tf.float32))
    safe_count = tf.maximum(count, 1.0)
    mean = tf.reduce_sum(values) / safe_count
    centered = tf.where(finite, values - mean, tf.zeros_like(values))
    std = tf.sqrt(tf.reduce_sum(tf.square(centered)) / safe_count)
    has_finite = count > 0
    big = tf.float32.max
    minimum = tf.where(has_finite, tf.reduce_min(tf.where(finite, values, big)), 0.0)
    maximum = tf.where(has_finite, tf.reduce_max(tf.where(finite, values, -big)), 0.0)
    zeros = tf.reduce_sum(tf.cast(tf.logical_and(finite, tf.equal(values, 0.0)), tf.float32))
    return tf.stack(
        [
            tf.norm(values),
            mean,
            std,
            minimum,
            maximum,
            zeros / tf.maximum(total, 1.0),
            total - count,
        ]
    )


def histogram(x, bucket_count, value_range=None):
    """A TensorBoard histogram of the finite elements of ``x``, on device.

    ``tf.histogram_fixed_width`` has no XLA kernel; this uses a bucket index
    and ``unsorted_segment_sum``, which compile everywhere.

    Args:
        x: A float tensor of any shape.
        bucket_count: Number of equal-width buckets (a Python ``int`` > 0).
        value_range: Optional ``(min, max)`` tensors; defaults to the min and
            max of the finite elements. A zero-width range is widened by 0.5 on
            each side, as TensorBoard does.

    Returns:
        A ``[bucket_count, 3]`` float32 tensor of (left edge, right edge,
        count), the format of TensorBoard's histogram plugin. The counts add up
        to the number of finite elements.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> stats.histogram(tf.constant([0.0, 1.0, 1.0, 4.0]), 2).numpy().tolist()
    [[0.0, 2.0, 3.0], [2.0, 4.0, 1.0]]
    """
    values, finite = _finite_parts(x)
    if value_range is None:
        big = tf.float32.max
        low = tf.reduce_min(tf.where(finite, values, big))
        high = tf.reduce_max(tf.where(finite, values, -big))
        has_finite = tf.reduce_any(finite)
        low = tf.where(has_finite, low, 0.0)
        high = tf.where(has_finite, high, 0.0)
    else:
        low, high = (tf.cast(v, tf.float32) for v in value_range)
    degenerate = high <= low
    low = tf.where(degenerate, low - 0.5, low)
    high = tf.where(degenerate, high + 0.5, high)
    width = (high - low) / bucket_count
    index = tf.cast(tf.floor((values - low) / width), tf.int32)
    index = tf.clip_by_value(index, 0, bucket_count - 1)
    counts = tf.math.unsorted_segment_sum(tf.cast(finite, tf.float32), index, bucket_count)
    edges = low + width * tf.range(bucket_count + 1, dtype=tf.float32)
    # The last edge is set exactly so float rounding never cuts off the max.
    edges = tf.concat([edges[:-1], [high]], axis=0)
    return tf.stack([edges[:-1], edges[1:], counts], axis=1)


def example_norms(x):
    """L2 norm of each example (row) of ``x``; a ``[batch]`` float32 tensor.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> stats.example_norms(tf.constant([[3.0, 4.0], [0.0, 1.0]])).numpy().tolist()
    [5.0, 1.0]
    """
    x = tf.cast(x, tf.float32)
    batch = tf.shape(x)[0]
    return tf.norm(tf.reshape(x, [batch, -1]), axis=1)


def global_norm(tensors):
    """The L2 norm of all ``tensors`` taken together, in float32."""
    squares = [tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in tensors]
    return tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0)


def count_nonfinite(x):
    """Number of NaN and Inf elements of ``x`` as ``[nan_count, inf_count]``."""
    x = tf.reshape(x, [-1])
    nans = tf.reduce_sum(tf.cast(tf.math.is_nan(x), tf.float32))
    infs = tf.reduce_sum(tf.cast(tf.math.is_inf(x), tf.float32))
    return tf.stack([nans, infs])
