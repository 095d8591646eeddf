"""The statistics of tensors that need care: NaN, Inf, overflowing squares, a dominant mean.

`kgrad.backends.tensorflow.summarize.stats.summarize_many` computes straight-line moments of every tensor
and takes this module's path only when one of them is not simple: centered
variances, exact counts of the finite elements, and, under XLA, every tensor
at once in blocks (`exact_summaries_in_blocks`).
"""

import functools
import typing

import tensorflow as tf

from kgrad.backends.common.norms import squares_are_exact
from kgrad.backends.tensorflow.summarize.histograms import (
    bucket_counts,
    bucket_counts_many,
    bucket_edges,
    histogram_rows,
)

# Below this largest magnitude a tensor's squares could be flushed to 0: `exact_summaries_in_blocks`
# rescales it (as `_exact_summary` rescales every tensor).
_TINY_MAGNITUDE = 2.0**-40


class _PlainMoments(typing.NamedTuple):
    """``[n]`` vectors of straight-line statistics of ``n`` flat tensors."""

    size: tf.Tensor
    count: tf.Tensor  # size, at least 1 (a divisor)
    squares: tf.Tensor
    mean: tf.Tensor
    variance: tf.Tensor  # E[x²] - E[x]²: see `summarize_many` for when it is exact
    minimum: tf.Tensor
    maximum: tf.Tensor
    nonzeros: tf.Tensor


def plain_moments(rows):
    """`_PlainMoments` of ``n`` tensors from their ``[n, 6]`` `kgrad.backends.tensorflow.summarize.one_pass` rows.

    Arithmetic on ``[n]`` vectors only: the tensors were read by
    `kgrad.backends.tensorflow.summarize.one_pass.reductions`.
    """
    size, squares, total, minimum, maximum, nonzeros = tf.unstack(rows, axis=1)
    count = tf.maximum(size, 1.0)
    not_empty = size > 0
    mean = total / count
    # The min and max of an empty tensor are +-Inf: 0 is reported.
    minimum = tf.where(not_empty, minimum, 0.0)
    maximum = tf.where(not_empty, maximum, 0.0)
    variance = tf.maximum(squares / count - tf.square(mean), 0.0)
    return _PlainMoments(size, count, squares, mean, variance, minimum, maximum, nonzeros)


def largest_magnitude(plain):
    """``[n]`` largest magnitudes of the tensors of `_PlainMoments` ``plain``, from their min and max."""
    return tf.maximum(tf.abs(plain.minimum), tf.abs(plain.maximum))


def moment_rows(plain, variance):
    """``[n, 7]`` rows of `MOMENT_NAMES` of finite tensors, with ``variance``."""
    return tf.stack(
        [
            tf.sqrt(plain.squares), plain.mean, tf.sqrt(variance), plain.minimum, plain.maximum,
            (plain.size - plain.nonzeros) / plain.count, tf.zeros_like(plain.size),
        ],
        axis=1,
    )


def finite_histograms(flat, plain, bucket_count):
    """``[n, bucket_count, 3]`` histograms of finite flat tensors (``[n, 0, 3]`` without buckets)."""
    if bucket_count is None:
        return tf.zeros([len(flat), 0, 3])
    edges = bucket_edges(plain.minimum, plain.maximum, bucket_count)
    ranges = tf.unstack(tf.stack([edges[:, 0], edges[:, -1]], axis=1))
    counts = bucket_counts_many(flat, ranges, bucket_count)
    return histogram_rows(edges, counts)


def careful_summary_function(bucket_count):
    """``fn(flat values, plain row, simple) -> (moments, histogram or [0, 3] zeros)``.

    `_careful_summary` of one flat tensor, outside XLA.
    """
    if tf.executing_eagerly():
        return functools.partial(_careful_summary, bucket_count=bucket_count)
    return _shared_careful_summary_function(bucket_count)


@functools.lru_cache(maxsize=None)
def _shared_careful_summary_function(bucket_count):
    # One shared function per bucket count: a step has hundreds of tensors,
    # and this path's ops, repeated for each, would take most of a large
    # model's tracing time and memory.
    signature = [
        tf.TensorSpec([None], tf.float32),
        tf.TensorSpec([len(_PlainMoments._fields)], tf.float32),
        tf.TensorSpec([], tf.bool),
    ]
    return tf.function(
        functools.partial(_careful_summary, bucket_count=bucket_count),
        input_signature=signature,
        autograph=False,
        experimental_attributes={"_noinline": True},
    )


def _careful_summary(values, plain_row, simple, bucket_count):
    """Moments and histogram of one flat tensor, whatever it holds.

    Args:
        values: The flat float32 tensor.
        plain_row: Its `_PlainMoments` as one vector, in field order.
        simple: Whether those are its moments as they are (finite squares, a
            mean that does not dominate the variance).
        bucket_count: As for `summarize_many`.

    Simple: the moments as they are. Finite squares: a centered variance
    (its mean dominates). With NaN, Inf or squares that overflow:
    `_exact_summary`.
    """
    plain = _PlainMoments(*tf.unstack(plain_row[:, tf.newaxis]))

    def finite():
        def centered():
            return 2.0 * tf.nn.l2_loss(values - plain.mean[0])[tf.newaxis] / plain.count

        variance = tf.cond(simple, lambda: plain.variance, centered)
        histograms = finite_histograms([values], plain, bucket_count)
        return moment_rows(plain, variance)[0], histograms[0]

    # Squares flushed to 0 (a gradient that vanished below 1e-19) need the rescaled, exact path too.
    exact = squares_are_exact(plain.squares[0], plain.size[0], largest_magnitude(plain)[0])
    return tf.cond(exact, finite, lambda: _exact_summary(values, bucket_count))


#: Elements per block of `exact_summaries_in_blocks`.
BLOCK = 1024


def exact_summaries_in_blocks(flat, bucket_count):
    """`_exact_summary` of every flat tensor at once, for XLA.

    Each tensor is padded with NaN to whole blocks of `BLOCK` elements and the
    blocks of all tensors are stacked into one ``[blocks, BLOCK]`` matrix:
    every statistic is a reduction of its rows, then a segment reduction of
    the rows of each tensor, and the histograms are one segment sum into
    ``n * bucket_count`` bins. A tensor adds its padding to the program and
    little else (their sizes are constants to XLA).

    The norm comes from the centered sum of squares plus ``count * mean²``,
    two non-negative terms: exact without a separate pass.

    Returns:
        ``(moments, histograms)``: ``[n, 7]``, and ``[n, bucket_count, 3]``
        (``[n, 0, 3]`` without ``bucket_count``).
    """
    n, block = len(flat), BLOCK
    sizes = tf.stack([tf.size(values) for values in flat])
    blocks_of = (sizes + (block - 1)) // block
    # Padded with NaN, which every statistic leaves out as it does the
    # tensors' own NaN; `sizes` says how many were the tensors'.
    padded = [
        tf.pad(values, [[0, count * block - tf.size(values)]], constant_values=float("nan"))
        for values, count in zip(flat, tf.unstack(blocks_of))
    ]
    rows = tf.reshape(tf.concat(padded, axis=0), [-1, block])
    # The tensor each row belongs to: a 1 where each tensor after the first
    # starts (an empty tensor starts where the next one does), summed up.
    # One row more, for empty tensors at the end.
    first_row = tf.cumsum(blocks_of, exclusive=True)
    row_count = tf.shape(rows)[0]
    starts = tf.tensor_scatter_nd_add(
        tf.zeros([row_count + 1], tf.int32), first_row[1:, tf.newaxis], tf.ones([n - 1], tf.int32)
    )
    owner = tf.cumsum(starts)[:row_count]
    finite = tf.math.is_finite(rows)
    kept = tf.where(finite, rows, tf.zeros_like(rows))

    def per_tensor(row_values, segment_reduction):
        return segment_reduction(row_values, owner, n)

    def count_per_tensor(mask):
        return per_tensor(tf.reduce_sum(tf.cast(mask, tf.int32), axis=1), tf.math.unsorted_segment_sum)

    finite_count = count_per_tensor(finite)
    nonzero_count = count_per_tensor(tf.logical_and(finite, tf.not_equal(rows, 0.0)))
    big = tf.float32.max
    has_finite = finite_count > 0
    minimum = per_tensor(tf.reduce_min(tf.where(finite, rows, big), axis=1), tf.math.unsorted_segment_min)
    maximum = per_tensor(tf.reduce_max(tf.where(finite, rows, -big), axis=1), tf.math.unsorted_segment_max)
    minimum = tf.where(has_finite, minimum, 0.0)
    maximum = tf.where(has_finite, maximum, 0.0)
    count = tf.cast(finite_count, tf.float32)
    safe_count = tf.maximum(count, 1.0)
    # Squares that could overflow float32, or be flushed to 0 (all below 2**-40: a gradient that
    # vanished), are taken of values divided by the largest magnitude; other tensors are not
    # scaled (nor rounded by it).
    magnitude = tf.maximum(tf.abs(minimum), tf.abs(maximum))
    overflows = magnitude >= tf.sqrt(big) / tf.sqrt(safe_count)
    scale = tf.where(tf.logical_and(overflows | (magnitude < _TINY_MAGNITUDE), magnitude > 0), magnitude, 1.0)
    scaled = kept / tf.gather(scale, owner)[:, tf.newaxis]
    scaled_mean = per_tensor(tf.reduce_sum(scaled, axis=1), tf.math.unsorted_segment_sum) / safe_count
    centered = tf.where(finite, scaled - tf.gather(scaled_mean, owner)[:, tf.newaxis], tf.zeros_like(rows))
    centered_squares = per_tensor(tf.reduce_sum(tf.square(centered), axis=1), tf.math.unsorted_segment_sum)
    size = tf.cast(sizes, tf.float32)
    moments = tf.stack(
        [
            scale * tf.sqrt(centered_squares + count * tf.square(scaled_mean)),
            scale * scaled_mean,
            scale * tf.sqrt(centered_squares / safe_count),
            minimum,
            maximum,
            (count - tf.cast(nonzero_count, tf.float32)) / tf.maximum(size, 1.0),
            tf.cast(sizes - finite_count, tf.float32),
        ],
        axis=1,
    )
    if bucket_count is None:
        return moments, tf.zeros([n, 0, 3])
    edges = bucket_edges(minimum, maximum, bucket_count)
    low = edges[:, 0]
    width = (edges[:, -1] - low) / bucket_count
    # As `bucket_counts` computes it under XLA, each row with its tensor's range.
    index = tf.cast(
        tf.floor((rows - tf.gather(low, owner)[:, tf.newaxis]) / tf.gather(width, owner)[:, tf.newaxis]),
        tf.int32,
    )
    bins = tf.clip_by_value(index, 0, bucket_count - 1) + (owner * bucket_count)[:, tf.newaxis]
    counts = tf.math.unsorted_segment_sum(tf.cast(finite, tf.int32), bins, n * bucket_count)
    return moments, histogram_rows(edges, tf.reshape(counts, [n, bucket_count]))


def _exact_summary(values, bucket_count):
    """Moments and histogram of flat ``values`` that may hold NaN, Inf or huge values."""
    moments = _masked_moments(values)
    if bucket_count is None:
        return moments, tf.zeros([0, 3])
    finite = tf.math.is_finite(values)
    edges = bucket_edges(moments[3][tf.newaxis], moments[4][tf.newaxis], bucket_count)
    counts = bucket_counts(values, finite, edges[0, 0], edges[0, -1], bucket_count)
    return moments, histogram_rows(edges, counts[tf.newaxis])[0]


def _masked_moments(values):
    """`moments` of ``values`` that may hold NaN, Inf or overflowing squares."""
    finite = tf.math.is_finite(values)
    values = tf.where(finite, values, tf.zeros_like(values))
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
