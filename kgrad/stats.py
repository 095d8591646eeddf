"""Pure on-device summaries of a tensor, all compilable by XLA.

Every function takes tensors and returns tensors; nothing here reads values to
the host, writes files or keeps state. Statistics are computed in float32 over
the *finite* elements; non-finite elements are counted separately, so a single
NaN does not hide the shape of the rest of the distribution.
"""

import functools
import typing

import tensorflow as tf
from tensorflow.python.ops import control_flow_util

#: Names of the values returned by `moments`, in order.
MOMENT_NAMES = ("norm", "mean", "std", "min", "max", "zero_fraction", "nonfinite")


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
    return summarize(x)[0]


def summarize(x, bucket_count=None):
    """`moments` of ``x`` and, with ``bucket_count``, its `histogram`, together.

    Args:
        x: A tensor of any float dtype and shape.
        bucket_count: Buckets of the histogram, or ``None`` for none.

    Returns:
        ``(moments, histogram)``: a ``[7]`` float32 tensor as `moments`
        returns, and a ``[bucket_count, 3]`` float32 tensor as `histogram`
        returns over the finite min and max (``None`` without
        ``bucket_count``).

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> moments, histogram = stats.summarize(tf.constant([0.0, 1.0, 1.0, 4.0]), 2)
    >>> float(moments[0]), histogram.numpy().tolist()
    (4.242640495300293, [[0.0, 2.0, 3.0], [2.0, 4.0, 1.0]])
    """
    moments, histograms = summarize_many([x], bucket_count)
    return moments[0], None if histograms is None else histograms[0]


def summarize_many(tensors, bucket_count=None):
    """`summarize` of several tensors at once, as a probed step needs.

    A probed step summarizes every captured tensor, so the common case is
    made cheap: each tensor is read by five straight-line reductions (sum of
    squares, sum, min, max, nonzero count) and, with ``bucket_count``, one
    histogram kernel; everything else is computed for all tensors together.
    A single branch for the whole call handles the tensors that need more:
    when a tensor's mean is so large that E[x²] - E[x]² would lose the
    variance to round-off, it gets a centered pass; when it holds NaN or
    Inf, or squares that overflow float32, it is masked, rescaled and
    centered. The other tensors of the call keep their five reductions and
    only get their histogram in that branch. Under XLA, which compiles the
    branch whether it runs or not, that branch summarizes every tensor again
    exactly, all of them in one program of fixed size.

    Args:
        tensors: A list of tensors of any float dtype and shape.
        bucket_count: Buckets per histogram, or ``None`` for none.

    Returns:
        ``(moments, histograms)``: a ``[n, 7]`` float32 tensor, one row of
        `MOMENT_NAMES` per tensor, and a ``[n, bucket_count, 3]`` float32
        tensor of histograms (``None`` without ``bucket_count``).

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> moments, _ = stats.summarize_many([tf.constant([3.0, 4.0]), tf.constant([0.0])])
    >>> moments[:, 0].numpy().tolist()  # the L2 norms
    [5.0, 0.0]
    """
    if bucket_count is not None:
        _check_bucket_count(bucket_count)
    if not tensors:
        histograms = None if bucket_count is None else tf.zeros([0, bucket_count, 3])
        return tf.zeros([0, len(MOMENT_NAMES)]), histograms
    # Per tensor only the kernels that read it, sharing their constants: a
    # large model's step summarizes hundreds of tensors, and each graph op
    # costs tracing and optimizing time on the first step.
    flat_shape = tf.constant([-1])
    flat = [tf.reshape(tf.cast(t, tf.float32), flat_shape) for t in tensors]
    plain = _plain_moments(flat)
    # A finite sum of squares means no element is NaN or Inf and no square
    # overflowed. E[x²] - E[x]² keeps ~5 significant digits of the variance
    # while the mean² is up to 100x the variance; beyond, a centered pass.
    simple = tf.logical_and(
        tf.math.is_finite(plain.squares), tf.square(plain.mean) <= 100.0 * plain.variance
    )

    def every_tensor_simple():
        return _moment_rows(plain, plain.variance), _finite_histograms(flat, plain, bucket_count)

    def some_tensors_need_care():
        # Common early in training, and for as long as a classifier's softmax
        # output stays near uniform (its mean dominates its variance); rare
        # otherwise (a step gone bad, or |x| > 1e19). Each tensor goes
        # through one shared function that branches on its own flag, so a
        # single tensor needing care does not make every other one read
        # again. A function, not a branch per tensor in the step's graph:
        # that cost the MobileNet's first probed step ~20 CPU-s of graph
        # optimization and ~350 MB of peak memory.
        if _in_xla():
            # XLA compiles this branch whether it runs or not. A program per
            # tensor took most of a probed step's compile time and memory
            # (the CNN's statistics alone: 19 CPU-s and 1.3-1.4 GB, against
            # 8-9 CPU-s and 1.0 GB in blocks), for a branch that runs ~1.4x
            # faster on CPU (52-55 against 70-82 ms there) when it runs.
            return _exact_summaries_in_blocks(flat, bucket_count)
        summary_of = _careful_summary_function(bucket_count)
        rows = tf.unstack(tf.stack(plain, axis=1))
        summaries = [summary_of(*arguments) for arguments in zip(flat, rows, tf.unstack(simple))]
        histograms = tf.stack([summary[1] for summary in summaries])
        return tf.stack([summary[0] for summary in summaries]), histograms

    moments, histograms = tf.cond(tf.reduce_all(simple), every_tensor_simple, some_tensors_need_care)
    return moments, None if bucket_count is None else histograms


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


def _plain_moments(flat):
    """`_PlainMoments` of flat float32 tensors: five reductions of each, no branch."""
    axis = tf.constant([0])
    size = tf.cast(tf.stack([tf.size(v) for v in flat]), tf.float32)
    count = tf.maximum(size, 1.0)
    not_empty = size > 0
    squares = 2.0 * tf.stack([tf.nn.l2_loss(v) for v in flat])
    mean = tf.stack([tf.reduce_sum(v, axis) for v in flat]) / count
    # The min and max of an empty tensor are +-Inf: 0 is reported.
    minimum = tf.where(not_empty, tf.stack([tf.reduce_min(v, axis) for v in flat]), 0.0)
    maximum = tf.where(not_empty, tf.stack([tf.reduce_max(v, axis) for v in flat]), 0.0)
    # sign(x)² is 1 where x != 0: two passes, no bool or int tensor (a third
    # to half of the time of `tf.equal` or casts and an integer sum). The sum
    # is TensorFlow's blocked float32 reduction, not a running sum that would
    # stop growing at 2**24: exact to float32 rounding at any size (tested).
    nonzeros = 2.0 * tf.stack([tf.nn.l2_loss(tf.sign(v)) for v in flat])
    variance = tf.maximum(squares / count - tf.square(mean), 0.0)
    return _PlainMoments(size, count, squares, mean, variance, minimum, maximum, nonzeros)


def _moment_rows(plain, variance):
    """``[n, 7]`` rows of `MOMENT_NAMES` of finite tensors, with ``variance``."""
    return tf.stack(
        [
            tf.sqrt(plain.squares), plain.mean, tf.sqrt(variance), plain.minimum, plain.maximum,
            (plain.size - plain.nonzeros) / plain.count, tf.zeros_like(plain.size),
        ],
        axis=1,
    )


def _finite_histograms(flat, plain, bucket_count):
    """``[n, bucket_count, 3]`` histograms of finite flat tensors (``[n, 0, 3]`` without buckets)."""
    if bucket_count is None:
        return tf.zeros([len(flat), 0, 3])
    edges = _edges(plain.minimum, plain.maximum, bucket_count)
    ranges = tf.unstack(tf.stack([edges[:, 0], edges[:, -1]], axis=1))
    counts = _bucket_counts_many(flat, ranges, bucket_count)
    return _histograms(edges, counts)


def _in_xla():
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _careful_summary_function(bucket_count):
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
        histograms = _finite_histograms([values], plain, bucket_count)
        return _moment_rows(plain, variance)[0], histograms[0]

    return tf.cond(
        tf.math.is_finite(plain.squares[0]), finite, lambda: _exact_summary(values, bucket_count)
    )


#: Elements per block of `_exact_summaries_in_blocks`.
_BLOCK = 1024


def _exact_summaries_in_blocks(flat, bucket_count):
    """`_exact_summary` of every flat tensor at once, for XLA.

    Each tensor is padded with NaN to whole blocks of `_BLOCK` elements and the
    blocks of all tensors are stacked into one ``[blocks, _BLOCK]`` matrix:
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
    n, block = len(flat), _BLOCK
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
    # Squares that could overflow float32 are taken of values divided by the
    # largest magnitude; other tensors are not scaled (nor rounded by it).
    magnitude = tf.maximum(tf.abs(minimum), tf.abs(maximum))
    overflows = magnitude >= tf.sqrt(big) / tf.sqrt(safe_count)
    scale = tf.where(tf.logical_and(overflows, magnitude > 0), magnitude, 1.0)
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
    edges = _edges(minimum, maximum, bucket_count)
    low = edges[:, 0]
    width = (edges[:, -1] - low) / bucket_count
    # As `_bucket_counts` computes it under XLA, each row with its tensor's range.
    index = tf.cast(
        tf.floor((rows - tf.gather(low, owner)[:, tf.newaxis]) / tf.gather(width, owner)[:, tf.newaxis]),
        tf.int32,
    )
    bins = tf.clip_by_value(index, 0, bucket_count - 1) + (owner * bucket_count)[:, tf.newaxis]
    counts = tf.math.unsorted_segment_sum(tf.cast(finite, tf.int32), bins, n * bucket_count)
    return moments, _histograms(edges, tf.reshape(counts, [n, bucket_count]))


def _exact_summary(values, bucket_count):
    """Moments and histogram of flat ``values`` that may hold NaN, Inf or huge values."""
    moments = _masked_moments(values)
    if bucket_count is None:
        return moments, tf.zeros([0, 3])
    finite = tf.math.is_finite(values)
    edges = _edges(moments[3][tf.newaxis], moments[4][tf.newaxis], bucket_count)
    counts = _bucket_counts(values, finite, edges[0, 0], edges[0, -1], bucket_count)
    return moments, _histograms(edges, counts[tf.newaxis])[0]


def sum_of_squares(x):
    """``sum(x²)`` in float32, in one pass over ``x`` with no temporary.

    ``tf.nn.l2_loss`` is one fused kernel; ``reduce_sum(square(x))`` is two
    passes and a tensor the size of ``x``.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> float(stats.sum_of_squares(tf.constant([3.0, 4.0])))
    25.0
    """
    return 2.0 * tf.nn.l2_loss(tf.cast(x, tf.float32))


def l2_norm(x):
    """The L2 norm of all of ``x``, in float32, in one pass (see `sum_of_squares`).

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> float(stats.l2_norm(tf.constant([[3.0], [4.0]])))
    5.0
    """
    return tf.sqrt(sum_of_squares(x))


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


def _check_bucket_count(bucket_count):
    if isinstance(bucket_count, bool) or not isinstance(bucket_count, int) or bucket_count < 1:
        raise ValueError(
            "`bucket_count` must be a positive Python int. Received: "
            f"bucket_count={bucket_count!r}. Example: histogram(x, bucket_count=30)."
        )


def histogram(x, bucket_count, value_range=None):
    """A TensorBoard histogram of the finite elements of ``x``, on device.

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
    _check_bucket_count(bucket_count)
    if value_range is None:
        return summarize(x, bucket_count)[1]
    values = tf.reshape(tf.cast(x, tf.float32), [-1])
    low, high = (tf.reshape(tf.cast(v, tf.float32), [1]) for v in value_range)
    edges = _edges(low, high, bucket_count)
    counts = _bucket_counts(values, tf.math.is_finite(values), edges[0, 0], edges[0, -1], bucket_count)
    return _histograms(edges, counts[tf.newaxis])[0]


def _edges(low, high, bucket_count):
    """``[n, bucket_count + 1]`` edges over each [low, high] (``[n]`` each), widened when empty."""
    degenerate = high <= low
    low = tf.where(degenerate, low - 0.5, low)
    high = tf.where(degenerate, high + 0.5, high)
    width = (high - low) / bucket_count
    edges = low[:, tf.newaxis] + width[:, tf.newaxis] * tf.range(bucket_count + 1, dtype=tf.float32)
    # The last edge is set exactly so float rounding never cuts off the max.
    return tf.concat([edges[:, :-1], high[:, tf.newaxis]], axis=1)


def _histograms(edges, counts):
    """``[n, k, 3]`` histograms from ``[n, k + 1]`` edges and ``[n, k]`` integer counts."""
    return tf.stack([edges[:, :-1], edges[:, 1:], tf.cast(counts, tf.float32)], axis=2)


def _bucket_counts_many(flat, ranges, bucket_count):
    """``[n, k]`` integer counts of finite flat tensors, each in its ``[2]`` (low, high) range."""
    if _in_xla():
        return tf.stack([
            _bucket_counts(values, None, value_range[0], value_range[1], bucket_count)
            for values, value_range in zip(flat, ranges)
        ])
    nbins = tf.constant(bucket_count)
    return tf.stack([
        tf.raw_ops.HistogramFixedWidth(values=values, value_range=value_range, nbins=nbins)
        for values, value_range in zip(flat, ranges)
    ])


def _bucket_counts(values, finite, low, high, bucket_count):
    """Integer counts of the finite ``values`` in equal buckets of [low, high].

    ``finite`` is the mask of finite values, or ``None`` when all are.
    """
    if not _in_xla():
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


def combined_norm(norms, nonfinite_counts, tensors):
    """`global_norm` of ``tensors`` from their own norms, without another pass.

    Args:
        norms: Float32 scalars (a list or a vector), the L2 norm of the
            finite elements of each tensor (``moments(t)[0]``).
        nonfinite_counts: Float32 scalars (a list or a vector), each
            tensor's non-finite count.
        tensors: The tensors themselves; read again only when one holds
            NaN or Inf, so that the result is NaN or Inf as `global_norm`'s.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad import stats
    >>> tensors = [tf.constant([3.0]), tf.constant([[4.0]])]
    >>> moments = [stats.moments(t) for t in tensors]
    >>> float(stats.combined_norm([m[0] for m in moments], [m[6] for m in moments], tensors))
    5.0
    """
    if not tensors:
        return tf.constant(0.0)

    def non_finite():
        # NaN if any element is NaN, else Inf: the plain sum of all squares
        # says which (an overflowing square only adds Inf to an Inf).
        return tf.sqrt(tf.add_n([sum_of_squares(t) for t in tensors]))

    return tf.cond(
        tf.reduce_any(tf.convert_to_tensor(nonfinite_counts) > 0),
        non_finite,
        lambda: _norm(tf.convert_to_tensor(norms)),
    )


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
    if x.dtype in (tf.float16, tf.bfloat16):
        x = tf.cast(x, tf.float32)  # NaN and Inf stay NaN and Inf
    if x.dtype != tf.float32 or tf.executing_eagerly():
        return _count_flat(x)
    # One shared function, as for `summarize`: the guard counts hundreds of
    # tensors in the branch that locates a bad step.
    return _count_function()(x)


def _count_flat(values):
    return tf.stack([_count(tf.math.is_nan(values)), _count(tf.math.is_inf(values))])


@functools.lru_cache(maxsize=None)
def _count_function():
    return tf.function(
        _count_flat,
        input_signature=[tf.TensorSpec([None], tf.float32)],
        autograph=False,
        experimental_attributes={"_noinline": True},
    )
