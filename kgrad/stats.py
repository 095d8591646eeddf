"""Pure on-device summaries of a tensor, all compilable by XLA.

Every function takes tensors and returns tensors; nothing here reads values to
the host, writes files or keeps state. Statistics are computed in float32 over
the *finite* elements; non-finite elements are counted separately, so a single
NaN does not hide the shape of the rest of the distribution.
"""

import tensorflow as tf
from tensorflow.python.ops import control_flow_util

#: Names of the values returned by `moments`, in order.
MOMENT_NAMES = ("norm", "mean", "std", "min", "max", "zero_fraction", "nonfinite")


def _finite_parts(x):
    x = tf.cast(tf.reshape(x, [-1]), tf.float32)
    finite = tf.math.is_finite(x)
    return tf.where(finite, x, tf.zeros_like(x)), finite


def _count(mask):
    # Counted as integers: a float32 sum of ones stops growing at 2**24, which
    # an activation gradient of a real network easily exceeds.
    return tf.cast(tf.reduce_sum(tf.cast(mask, tf.int32)), tf.float32)


def _safe_scale(values, axis=None):
    # Squares of exploding gradients (|g| > 1e19) overflow float32; dividing
    # by the largest magnitude first keeps norms and std finite.
    # Inf and NaN are left to propagate as they would without scaling.
    scale = tf.reduce_max(tf.abs(values), axis=axis, keepdims=axis is not None)
    usable = tf.logical_and(scale > 0, tf.math.is_finite(scale))
    return tf.where(usable, scale, tf.ones_like(scale))


def moments(x):
    """Summary statistics of ``x`` as a float32 vector of `MOMENT_NAMES`.

    Args:
        x: A tensor of any float dtype and shape.

    Returns:
        A ``[7]`` float32 tensor: L2 norm, mean, standard deviation
        (population, ``ddof=0``), min and max of the finite elements,
        fraction of all elements that are exactly zero, and the count of
        non-finite (NaN or Inf) elements. Min and max are 0 when there is no
        finite element. Values beyond the float32 range count as non-finite.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> [round(float(v), 3) for v in stats.moments(tf.constant([0.0, 3.0, 4.0]))]
    [5.0, 2.333, 1.7, 0.0, 4.0, 0.333, 0.0]
    """
    # Few passes over the elements: this runs for every captured tensor of
    # every probed step. Counts are integer ops (exact beyond 2**24).
    values, finite = _finite_parts(x)
    size = tf.size(values, out_type=tf.int64)
    finite_count = tf.math.count_nonzero(finite, dtype=tf.int64)
    nonzero_count = tf.math.count_nonzero(values, dtype=tf.int64)  # non-finite are 0 here
    count = tf.cast(finite_count, tf.float32)
    safe_count = tf.maximum(count, 1.0)
    has_finite = finite_count > 0
    big = tf.float32.max
    minimum = tf.where(has_finite, tf.reduce_min(tf.where(finite, values, big)), 0.0)
    maximum = tf.where(has_finite, tf.reduce_max(tf.where(finite, values, -big)), 0.0)
    # Squares of |x| > 1e19 overflow float32: scale by the largest magnitude.
    magnitude = tf.maximum(tf.abs(minimum), tf.abs(maximum))
    scale = tf.where(magnitude > 0, magnitude, 1.0)
    scaled = values / scale
    scaled_mean = tf.reduce_sum(scaled) / safe_count
    centered = tf.where(finite, scaled - scaled_mean, tf.zeros_like(scaled))
    zeros = tf.cast(finite_count - nonzero_count, tf.float32)
    return tf.stack(
        [
            scale * tf.sqrt(tf.reduce_sum(tf.square(scaled))),
            scale * scaled_mean,
            scale * tf.sqrt(tf.reduce_sum(tf.square(centered)) / safe_count),
            minimum,
            maximum,
            zeros / tf.maximum(tf.cast(size, tf.float32), 1.0),
            tf.cast(size - finite_count, tf.float32),
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
            each side. Elements outside the range are counted in the first or
            last bucket.

    Returns:
        A ``[bucket_count, 3]`` float32 tensor of (left edge, right edge,
        count), the format of TensorBoard's histogram plugin. The counts add up
        to the number of finite elements.

    Raises:
        ValueError: If ``bucket_count`` is not a positive ``int``.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> stats.histogram(tf.constant([0.0, 1.0, 1.0, 4.0]), 2).numpy().tolist()
    [[0.0, 2.0, 3.0], [2.0, 4.0, 1.0]]
    """
    if isinstance(bucket_count, bool) or not isinstance(bucket_count, int) or bucket_count < 1:
        raise ValueError(
            "`bucket_count` must be a positive Python int. Received: "
            f"bucket_count={bucket_count!r}. Example: histogram(x, bucket_count=30)."
        )
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
    counts = tf.cast(_bucket_counts(values, finite, low, high, bucket_count), tf.float32)
    edges = low + width * tf.range(bucket_count + 1, dtype=tf.float32)
    # The last edge is set exactly so float rounding never cuts off the max.
    edges = tf.concat([edges[:-1], [high]], axis=0)
    return tf.stack([edges[:-1], edges[1:], counts], axis=1)


def _bucket_counts(values, finite, low, high, bucket_count):
    """Integer counts of the finite ``values`` in equal buckets of [low, high]."""
    if not control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        # Outside XLA, TensorFlow's own kernel is several times faster than a
        # scatter. Non-finite elements are moved to the first bucket, then
        # taken out of it.
        counts = tf.histogram_fixed_width(
            tf.where(finite, values, low), tf.stack([low, high]), nbins=bucket_count
        )
        nonfinite = tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int32))
        return counts - tf.one_hot(0, bucket_count, on_value=nonfinite, off_value=0)
    # `tf.histogram_fixed_width` has no XLA kernel: a bucket index and a
    # segment sum compile everywhere.
    width = (high - low) / bucket_count
    index = tf.cast(tf.floor((values - low) / width), tf.int32)
    index = tf.clip_by_value(index, 0, bucket_count - 1)
    # Integer counts: a float32 count stops growing at 2**24 elements.
    return tf.math.unsorted_segment_sum(tf.cast(finite, tf.int32), index, bucket_count)


def _norm(x, axis=None):
    scale = _safe_scale(x, axis)
    norm = tf.norm(x / scale, axis=axis, keepdims=axis is not None) * scale
    return norm if axis is None else tf.squeeze(norm, axis)


def example_norms(x):
    """L2 norm of each example (row) of ``x``; a ``[batch]`` float32 tensor.

    Exact also for gradients too large to square in float32.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> stats.example_norms(tf.constant([[3.0, 4.0], [0.0, 1.0]])).numpy().tolist()
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
    >>> from kgrad import stats
    >>> float(stats.global_norm([tf.constant([3.0]), tf.constant([[4.0]])]))
    5.0
    """
    if not tensors:
        return tf.constant(0.0)
    norms = [_norm(tf.reshape(tf.cast(t, tf.float32), [-1])) for t in tensors]
    return _norm(tf.stack(norms))


def count_nonfinite(x):
    """Number of NaN and Inf elements of ``x`` as ``[nan_count, inf_count]``.

    Args:
        x: A tensor of any dtype and shape (non-float tensors have none).

    Returns:
        A ``[2]`` float32 tensor.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> nan, inf = float("nan"), float("inf")
    >>> stats.count_nonfinite(tf.constant([1.0, nan, inf, -inf])).numpy().tolist()
    [1.0, 2.0]
    """
    x = tf.reshape(tf.convert_to_tensor(x), [-1])
    if not x.dtype.is_floating:
        return tf.zeros([2], tf.float32)
    return tf.stack([_count(tf.math.is_nan(x)), _count(tf.math.is_inf(x))])
