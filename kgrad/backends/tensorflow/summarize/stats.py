"""Pure on-device summaries of a tensor, all compilable by XLA.

Every function takes tensors and returns tensors; nothing here reads values to
the host, writes files or keeps state. Statistics are computed in float32. The
L2 norm is the norm of every element, NaN or Inf when one is (as
``tf.norm``'s: a norm read alone must not look finite; `kgrad.backends.tensorflow.summarize.norms` has the
norms on their own); the mean, std, min, max and histogram are of the
*finite* elements, and non-finite elements are counted separately, so a
single NaN does not hide the shape of the rest of the distribution.
"""

import functools

import tensorflow as tf

from kgrad.plan.tag_names import MOMENT_NAMES  # noqa: F401 (stats.MOMENT_NAMES, the columns it computes)
from kgrad.backends.tensorflow.summarize.careful_stats import (  # noqa: F401 (re-exported for tests)
    BLOCK,
    careful_summary_function,
    exact_summaries_in_blocks,
    finite_histograms,
    largest_magnitude,
    moment_rows,
    plain_moments,
)
from kgrad.backends.tensorflow.summarize.histograms import (
    bucket_counts,
    check_bucket_count,
    bucket_edges,
    histogram_rows,
    in_xla,
)
from kgrad.backends.common.norms import squares_are_exact
from kgrad.backends.tensorflow.summarize import one_pass
from kgrad.plan.histogram_buckets import is_log_magnitude_count, log_magnitude_edges

#: Names of the values returned by `moments`, in order.


def _count(mask):
    # Counted as integers: a float32 sum of ones stops growing at 2**24, which
    # an activation gradient of a real network easily exceeds.
    return tf.cast(tf.reduce_sum(tf.cast(mask, tf.int32)), tf.float32)


def moments(x):
    """Summary statistics of ``x`` as a float32 vector of `MOMENT_NAMES`.

    Args:
        x: A tensor of any float dtype and shape.

    Returns:
        A ``[7]`` float32 tensor: the L2 norm of all elements (NaN when
        one is NaN, else Inf when one is Inf), then the mean, standard
        deviation (population, ``ddof=0``), min and max of the finite elements,
        fraction of all elements that are exactly zero, and the count of
        non-finite (NaN or Inf) elements. Min and max are 0 when there is no
        finite element. Values beyond the float32 range count as non-finite.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize import stats
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
    >>> from kgrad.backends.tensorflow.summarize import stats
    >>> moments, histogram = stats.summarize(tf.constant([0.0, 1.0, 1.0, 4.0]), 2)
    >>> float(moments[0]), histogram.numpy().tolist()
    (4.242640495300293, [[0.0, 2.0, 3.0], [2.0, 4.0, 1.0]])
    """
    moments, histograms = summarize_many([x], bucket_count)
    return moments[0], None if histograms is None else histograms[0]


def summarize_many(tensors, bucket_count=None):
    """`summarize` of several tensors at once, as a probed step needs.

    A probed step summarizes every captured tensor, so the common case is
    made cheap: the five straight-line reductions of every tensor (sum of
    squares, sum, min, max, nonzero count) and its log-magnitude bucket keys
    are a few kernels over the rows of one matrix of all the tensors, one
    call that XLA does not compile (`kgrad.backends.tensorflow.summarize.blocks`),
    the log-magnitude counts of all tensors one ``bincount``; a linear
    histogram is one kernel per tensor; everything else is computed for all
    tensors together.
    A single branch for the whole call handles the tensors that need more:
    when a tensor's mean is so large that E[x²] - E[x]² would lose the
    variance to round-off, it gets a centered pass; when it holds NaN or
    Inf, or squares that overflow float32, it is masked, rescaled and
    centered. The other tensors of the call keep their five reductions and
    only get their linear histogram in that branch. Under XLA, which compiles the
    branch whether it runs or not, that branch summarizes every tensor again
    exactly, all of them in one program of fixed size.

    Args:
        tensors: A list of tensors of any float dtype and shape.
        bucket_count: Buckets per histogram, or ``None`` for none;
            `kgrad.plan.histogram_buckets.LOG_BUCKET_COUNT` for
            log-magnitude buckets.

    Returns:
        ``(moments, histograms)``: a ``[n, 7]`` float32 tensor, one row of
        `MOMENT_NAMES` per tensor, and a ``[n, bucket_count, 3]`` float32
        tensor of histograms (``None`` without ``bucket_count``).

    Example:

    >>> import tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize import stats
    >>> moments, _ = stats.summarize_many([tf.constant([3.0, 4.0]), tf.constant([0.0])])
    >>> moments[:, 0].numpy().tolist()  # the L2 norms
    [5.0, 0.0]
    """
    if bucket_count is not None:
        check_bucket_count(bucket_count)
    if not tensors:
        histograms = None if bucket_count is None else tf.zeros([0, bucket_count, 3])
        return tf.zeros([0, len(MOMENT_NAMES)]), histograms
    log_magnitude = is_log_magnitude_count(bucket_count)
    # Every tensor's reductions (and log-magnitude counts) in one call:
    # the ops this adds to a step do not grow with the number of tensors.
    rows, counts = one_pass.reductions(tensors, with_counts=log_magnitude)
    plain = plain_moments(rows)
    # A finite sum of squares means no element is NaN or Inf and no square
    # overflowed. E[x²] - E[x]² keeps ~5 significant digits of the variance
    # while the mean² is up to 100x the variance; beyond, a centered pass.
    # Squares below float32's smallest normal (|x| < 1e-19) are flushed to 0: a tensor of such
    # values (a gradient that vanished) would read a norm and std of 0, so it takes the careful
    # branch, which rescales (`squares_are_exact`).
    simple = tf.logical_and(
        squares_are_exact(plain.squares, plain.size, largest_magnitude(plain)),
        tf.square(plain.mean) <= 100.0 * plain.variance,
    )
    # Log-magnitude edges are fixed: those histograms need neither the min and
    # max nor the careful branch. Linear ones are counted in the branches.
    branch_buckets = None if log_magnitude else bucket_count

    def flat():
        # Built in the branches that read the tensors one by one, not in the step.
        return [tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors]

    def every_tensor_simple():
        if branch_buckets is None:
            return moment_rows(plain, plain.variance), tf.zeros([len(tensors), 0, 3])
        return moment_rows(plain, plain.variance), finite_histograms(flat(), plain, branch_buckets)

    def some_tensors_need_care():
        # Common early in training, and for as long as a classifier's softmax
        # output stays near uniform (its mean dominates its variance); rare
        # otherwise (a step gone bad, or |x| > 1e19). Each tensor goes
        # through one shared function that branches on its own flag, so a
        # single tensor needing care does not make every other one read
        # again. A function, not a branch per tensor in the step's graph:
        # that cost the MobileNet's first probed step ~20 CPU-s of graph
        # optimization and ~350 MB of peak memory.
        if in_xla():
            # XLA compiles this branch whether it runs or not. A program per
            # tensor took most of a probed step's compile time and memory
            # (the CNN's statistics alone: 19 CPU-s and 1.3-1.4 GB, against
            # 8-9 CPU-s and 1.0 GB in blocks), for a branch that runs ~1.4x
            # faster on CPU (52-55 against 70-82 ms there) when it runs.
            return exact_summaries_in_blocks(flat(), branch_buckets)
        summary_of = careful_summary_function(branch_buckets)
        plain_rows = tf.unstack(tf.stack(plain, axis=1))
        summaries = [summary_of(*arguments) for arguments in zip(flat(), plain_rows, tf.unstack(simple))]
        histograms = tf.stack([summary[1] for summary in summaries])
        return tf.stack([summary[0] for summary in summaries]), histograms

    moments, histograms = tf.cond(tf.reduce_all(simple), every_tensor_simple, some_tensors_need_care)
    # The norm of a tensor holding NaN or Inf is NaN or Inf, whatever its
    # finite elements: the plain sum of squares already says which (an
    # overflowing square only adds Inf to an Inf). A norm is often written
    # without its non-finite count beside it (``statistics="default"``).
    norms = tf.where(moments[:, 6] > 0, tf.sqrt(plain.squares), moments[:, 0])
    moments = tf.concat([norms[:, tf.newaxis], moments[:, 1:]], axis=1)
    if log_magnitude:
        edges = tf.constant(log_magnitude_edges())[tf.newaxis]
        histograms = histogram_rows(tf.tile(edges, [len(tensors), 1]), counts)
    return moments, None if bucket_count is None else histograms


def count_nonfinite(x):
    """Number of NaN and Inf elements of ``x`` as ``[nan_count, inf_count]``.

    Args:
        x: A tensor of any dtype and shape (non-float tensors have none).

    Returns:
        A ``[2]`` float32 tensor.

    Example:

    >>> import tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize import stats
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
    >>> from kgrad.backends.tensorflow.summarize import stats
    >>> stats.histogram(tf.constant([0.0, 1.0, 1.0, 4.0]), 2).numpy().tolist()
    [[0.0, 2.0, 3.0], [2.0, 4.0, 1.0]]
    """
    check_bucket_count(bucket_count)
    if value_range is None:
        return summarize(x, bucket_count)[1]
    values = tf.reshape(tf.cast(x, tf.float32), [-1])
    low, high = (tf.reshape(tf.cast(v, tf.float32), [1]) for v in value_range)
    edges = bucket_edges(low, high, bucket_count)
    counts = bucket_counts(values, tf.math.is_finite(values), edges[0, 0], edges[0, -1], bucket_count)
    return histogram_rows(edges, counts[tf.newaxis])[0]
