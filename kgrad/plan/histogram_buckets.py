"""The two kinds of histogram buckets, and the fixed edges of the log-magnitude kind.

``histogram_buckets="log"`` buckets every finite element by its sign and the
decade of its magnitude, on edges fixed once for all layers, steps and runs:

- ``BUCKETS_PER_DECADE`` buckets per decade of |x|, from ``1e-12`` to
  ``1e4`` (``MAGNITUDE_EDGES``), on each side of zero;
- one bucket in the middle, ``[-1e-12, 1e-12]``, for the elements exactly 0
  (and the subnormal float32 values, |x| < 1.2e-38, which TensorFlow's CPU
  kernels and XLA flush to 0 in arithmetic: counted as 0 on every device);
- magnitudes beyond the range go to the outermost bucket on their side: a
  |x| ≥ 1e4 to ``[1e4/√10, 1e4]`` and a |x| < 1e-12 that is not 0 to
  ``[1e-12, 1e-12·√10]`` (negated for negative values).

NaN, +Inf and −Inf are in no bucket: the non-finite count (``*_nonfinite/``)
counts them, as for the linear kind. An element ``v`` with ``E[j] ≤ |v| <
E[j + 1]`` (``E = MAGNITUDE_EDGES``, compared in float32) is in bucket
``j`` of its side. With no min/max pass, a step's counts of two shards or
replicas add exactly to the counts of the whole tensor.

``histogram_buckets="linear"`` is the earlier kind: ``bucket_count`` equal
buckets between the finite min and max of each tensor, each step.

Example:

>>> int(LOG_BUCKET_COUNT), f"{log_magnitude_edges()[LOG_BUCKET_COUNT // 2 + 1]:.3g}"
(65, '1e-12')
>>> is_log_magnitude(log_magnitude_edges()), is_log_magnitude([0.0, 1.0, 2.0])
(True, False)
"""

import numpy as np

#: What ``histogram_buckets=`` takes.
HISTOGRAM_BUCKETS = ("log", "linear")

#: Buckets per decade of magnitude (each spans a factor of √10).
BUCKETS_PER_DECADE = 2
#: The smallest and largest magnitude with buckets of their own, as powers of ten.
LOWEST_DECADE, HIGHEST_DECADE = -12, 4

#: ``[H + 1]`` float32 magnitudes 1e-12, 10**-11.5, ..., 1e4 bounding each side's ``H`` buckets.
MAGNITUDE_EDGES = np.power(
    10.0,
    np.arange(LOWEST_DECADE * BUCKETS_PER_DECADE, HIGHEST_DECADE * BUCKETS_PER_DECADE + 1)
    / BUCKETS_PER_DECADE,
).astype(np.float32)
#: The smallest normal float32: magnitudes below it (subnormals) count as 0.
SMALLEST_NORMAL = np.finfo(np.float32).tiny
#: Buckets on each side of zero.
BUCKETS_PER_SIDE = len(MAGNITUDE_EDGES) - 1


class LogMagnitudeBucketCount(int):
    """The bucket count of a log-magnitude histogram: an ``int`` that also says the kind.

    It travels where a linear histogram's ``bucket_count`` does (array shapes
    use it as the ``int`` it is), so a backend tells the two kinds apart
    where the histogram is computed, and nowhere else. It never equals a
    linear count of the same value.
    """

    def __eq__(self, other):
        return isinstance(other, LogMagnitudeBucketCount) and int(self) == int(other)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(("log_magnitude", int(self)))

    def __repr__(self):
        return f"LogMagnitudeBucketCount({int(self)})"


#: Buckets of a log-magnitude histogram: each side's, and the zero bucket.
LOG_BUCKET_COUNT = LogMagnitudeBucketCount(2 * BUCKETS_PER_SIDE + 1)


def is_log_magnitude_count(bucket_count):
    """Whether ``bucket_count`` (an ``int`` or ``None``) asks for log-magnitude buckets."""
    return isinstance(bucket_count, LogMagnitudeBucketCount)


def log_magnitude_edges():
    """The ``[LOG_BUCKET_COUNT + 1]`` float32 edges, from −1e4 to 1e4 (the zero bucket ±1e-12)."""
    return np.concatenate([-MAGNITUDE_EDGES[::-1], MAGNITUDE_EDGES])


def signed_boundaries():
    """``[LOG_BUCKET_COUNT - 1]`` float32 boundaries: a finite ``v``'s bucket is how many are ≤ ``v``.

    One binary search (``tf.raw_ops.Bucketize``, ``jnp.searchsorted(...,
    side="right")``) then gives the bucket of the rule above, in float32
    comparisons only: a positive side's boundary is its edge, a negative
    side's is the float32 just above −edge (|v| = edge belongs outward), and
    the zero bucket is (−SMALLEST_NORMAL, SMALLEST_NORMAL). The outermost
    edges bound nothing: beyond them is the outermost bucket.

    >>> bounds = signed_boundaries()
    >>> int(np.searchsorted(bounds, np.float32(-1e-12), side="right"))  # innermost negative bucket
    31
    """
    up = np.float32(np.inf)
    negative = np.nextafter(-MAGNITUDE_EDGES[BUCKETS_PER_SIDE - 1:0:-1], up)
    middle = np.array([np.nextafter(-SMALLEST_NORMAL, up), SMALLEST_NORMAL], np.float32)
    return np.concatenate([negative, middle, MAGNITUDE_EDGES[1:BUCKETS_PER_SIDE]]).astype(np.float32)


def is_log_magnitude(edges):
    """Whether a histogram's ``[k + 1]`` edges are the log-magnitude kind's (else linear).

    The edges identify the kind in the event files: a linear histogram's
    edges are equally spaced, these are not.
    """
    edges = np.asarray(edges, np.float32)
    expected = log_magnitude_edges()
    return edges.shape == expected.shape and bool(np.array_equal(edges, expected))


def resolve_bucket_count(histogram_buckets, bucket_count):
    """The bucket count a step computes: ``LOG_BUCKET_COUNT``, or ``bucket_count`` (30 when ``None``).

    ``histogram_buckets=None`` is ``"log"``, or ``"linear"`` when a
    ``bucket_count`` is given (code written before the log kind keeps its
    linear histograms).

    Raises:
        ValueError: If ``histogram_buckets`` is not one of `HISTOGRAM_BUCKETS`,
            or ``bucket_count`` is given with ``"log"`` (its buckets are fixed).
    """
    if histogram_buckets is None:
        linear = bucket_count is not None and not is_log_magnitude_count(bucket_count)
        histogram_buckets = "linear" if linear else "log"
    if not (isinstance(histogram_buckets, str) and histogram_buckets in HISTOGRAM_BUCKETS):
        raise ValueError(
            f"`histogram_buckets` must be one of {list(HISTOGRAM_BUCKETS)}. Received: "
            f"histogram_buckets={histogram_buckets!r}. 'log' buckets each element by its sign and the "
            "decade of its magnitude (1e-12 to 1e4); 'linear' uses `bucket_count` equal buckets "
            "between each tensor's min and max."
        )
    if histogram_buckets == "log":
        if bucket_count is not None and not is_log_magnitude_count(bucket_count):
            raise ValueError(
                "`bucket_count` applies to histogram_buckets='linear' only: log-magnitude buckets "
                f"are fixed ({int(LOG_BUCKET_COUNT)}). Received: bucket_count={bucket_count!r} with "
                "histogram_buckets='log'. Pass histogram_buckets='linear' to choose a bucket count."
            )
        return LOG_BUCKET_COUNT
    if bucket_count is None:
        return 30
    if is_log_magnitude_count(bucket_count):
        return int(bucket_count)
    return bucket_count
