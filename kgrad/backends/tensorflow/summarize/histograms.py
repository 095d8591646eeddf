"""XLA-friendly histograms on device: bucket index + segment sums, no ``tf.histogram_fixed_width``.

TensorFlow's histogram op has no XLA kernel; these compile under XLA and run
with TensorFlow's kernels elsewhere. A histogram is TensorBoard's ``[k, 3]``
tensor of (left edge, right edge, count), over the finite elements: equal
buckets between the min and max (linear), or fixed log-magnitude buckets
(`kgrad.backends.tensorflow.summarize.log_buckets`).
"""

import tensorflow as tf

from kgrad.backends.tensorflow.summarize.log_buckets import in_xla  # noqa: F401 (stats.in_xla)


def check_bucket_count(bucket_count):
    if isinstance(bucket_count, bool) or not isinstance(bucket_count, int) or bucket_count < 1:
        raise ValueError(
            "`bucket_count` must be a positive Python int. Received: "
            f"bucket_count={bucket_count!r}. Example: histogram(x, bucket_count=30)."
        )


def bucket_edges(low, high, bucket_count):
    """``[n, bucket_count + 1]`` edges over each [low, high] (``[n]`` each), widened when empty."""
    degenerate = high <= low
    low = tf.where(degenerate, low - 0.5, low)
    high = tf.where(degenerate, high + 0.5, high)
    width = (high - low) / bucket_count
    edges = low[:, tf.newaxis] + width[:, tf.newaxis] * tf.range(bucket_count + 1, dtype=tf.float32)
    # The last edge is set exactly so float rounding never cuts off the max.
    return tf.concat([edges[:, :-1], high[:, tf.newaxis]], axis=1)


def histogram_rows(edges, counts):
    """``[n, k, 3]`` histograms from ``[n, k + 1]`` edges and ``[n, k]`` integer counts."""
    return tf.stack([edges[:, :-1], edges[:, 1:], tf.cast(counts, tf.float32)], axis=2)


def bucket_counts_many(flat, ranges, bucket_count):
    """``[n, k]`` integer counts of finite flat tensors, each in its ``[2]`` (low, high) range."""
    if in_xla():
        return tf.stack([
            bucket_counts(values, None, value_range[0], value_range[1], bucket_count)
            for values, value_range in zip(flat, ranges)
        ])
    nbins = tf.constant(bucket_count)
    return tf.stack([
        tf.raw_ops.HistogramFixedWidth(values=values, value_range=value_range, nbins=nbins)
        for values, value_range in zip(flat, ranges)
    ])


def bucket_counts(values, finite, low, high, bucket_count):
    """Integer counts of the finite ``values`` in equal buckets of [low, high].

    ``finite`` is the mask of finite values, or ``None`` when all are.
    """
    if not in_xla():
        # Outside XLA, TensorFlow's own kernel is several times faster than a
        # scatter.
        value_range = tf.stack([low, high])
        if finite is None:
            return tf.histogram_fixed_width(values, value_range, nbins=bucket_count)
        # Non-finite elements are moved to the first bucket, then taken out.
        counts = tf.histogram_fixed_width(tf.where(finite, values, low), value_range, nbins=bucket_count)
        nonfinite = tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int32))
        return counts - tf.one_hot(0, bucket_count, on_value=nonfinite, off_value=0)
    # `tf.histogram_fixed_width` has no XLA kernel: a bucket index and a
    # segment sum compile everywhere.
    width = (high - low) / bucket_count
    index = tf.cast(tf.floor((values - low) / width), tf.int32)
    index = tf.clip_by_value(index, 0, bucket_count - 1)
    # Integer counts: a float32 count stops growing at 2**24 elements.
    ones = tf.ones_like(index) if finite is None else tf.cast(finite, tf.int32)
    return tf.math.unsorted_segment_sum(ones, index, bucket_count)
