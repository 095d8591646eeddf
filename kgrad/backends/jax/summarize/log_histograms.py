"""Log-magnitude histograms inside a jitted JAX step, on the edges of `kgrad.plan.histogram_buckets`.

The edges are fixed, so a histogram needs no min/max pass and no branch on
non-finite elements: NaN and ±Inf are not counted (the non-finite count of
the moments row counts them), everything else is in the bucket of its sign
and magnitude, as TensorFlow's `kgrad.backends.tensorflow.summarize.histograms`
computes it (there by a binary search over
`kgrad.plan.histogram_buckets.signed_boundaries`; both are checked against
NumPy and against each other).

On one device, a tensor of 2**17 elements or more is counted by one
reduction of 65 operands: for each boundary, how many finite elements are
at or above it (a bucket's count is the difference of two neighbours). XLA
fuses the comparisons into the reduction, so it reads the tensor once and
writes nothing its size. The scatter-add it replaced wrote each element's
bucket and weight out whole first (two int32 arrays the size of the
tensor) and was slower: 12.3 against 20.2 ms for 2**22 elements on CPU
(docs/costs.md). A smaller tensor
is still scattered (`counts_by_scatter`): the reduction compiles slower.
Under a ``keras.distribution`` each device counts its own shard of a large
tensor by the reduction, and the counts are summed
(`kgrad.backends.jax.summarize.sharded_counts`): a probed step of an MLP
with kernels of 2**21 elements split over 8 devices held 8.4 MB more than
Keras' step per device with the scatter, 141 KB more now.

Example:

>>> import jax.numpy as jnp
>>> counts = log_magnitude_histogram(jnp.array([0.0, 1.0, -1.0, jnp.nan]))[:, 2]
>>> int(counts.sum()), int(counts[LOG_BUCKET_COUNT // 2])  # 3 finite, 1 zero
(3, 1)
"""

import jax
import jax.numpy as jnp
import numpy as np

from kgrad.backends.jax.summarize.on_device import reducible
from kgrad.backends.jax.summarize.one_pass import on_several_devices
from kgrad.backends.jax.summarize.sharded_counts import counted_where_they_live
from kgrad.plan.histogram_buckets import (
    BUCKETS_PER_DECADE,
    BUCKETS_PER_SIDE,
    LOG_BUCKET_COUNT,
    LOWEST_DECADE,
    MAGNITUDE_EDGES,
    SMALLEST_NORMAL,
    log_magnitude_edges,
    signed_boundaries,
)


def log_magnitude_histogram(x):
    """TensorBoard's ``[LOG_BUCKET_COUNT, 3]`` float32 histogram of ``x``'s finite elements."""
    edges = jnp.asarray(log_magnitude_edges())
    # Not flattened under a distribution: a sharded tensor's counts are local counts, summed.
    counts = log_magnitude_counts(reducible(jnp.asarray(x).astype(jnp.float32)))
    return jnp.stack([edges[:-1], edges[1:], counts.astype(jnp.float32)], axis=1)


def log_magnitude_counts(values):
    """``[LOG_BUCKET_COUNT]`` int32 counts of the finite float32 ``values`` (any shape)."""
    if values.size == 0:
        return jnp.zeros([int(LOG_BUCKET_COUNT)], jnp.int32)
    if values.size < COUNTED_IN_ONE_REDUCTION_FROM:
        # A small tensor's scatter writes little, and the reduction compiles slower (a probed
        # step of a 9-layer MLP: 2.0 -> 2.9 s with every tensor counted by the reduction).
        # Sharded, XLA's partitioner scatters each shard and sums the counts.
        return counts_by_scatter(values)
    if on_several_devices():
        # Each device counts its shard by the reduction, and the counts are summed: XLA's
        # partitioner would gather every device's partial counts of each of its 65 operands.
        # (The scatter's edges are an array constant, which a custom partitioning cannot hold.)
        return counted_where_they_live(counts_by_reduction, values)
    return counts_by_reduction(values)


def counts_by_reduction(values):
    """`log_magnitude_counts` by one reduction of 65 comparisons (any size, one device or one shard)."""
    # Compared as NaN, a non-finite element is at or above no boundary; the first, -Inf, then
    # counts the finite elements. Integer counts: a float32 count stops growing at 2**24.
    finite = jnp.where(jnp.isfinite(values), values, jnp.nan)
    at_or_above = jax.lax.reduce(
        tuple((finite >= bound).astype(jnp.int32) for bound in _BOUNDARIES),
        (np.int32(0),) * len(_BOUNDARIES),
        lambda left, right: tuple(a + b for a, b in zip(left, right)),
        tuple(range(values.ndim)),
    )
    at_or_above = jnp.stack(at_or_above)
    # Subnormals count as 0 (the zero bucket is (-SMALLEST_NORMAL, SMALLEST_NORMAL)), as on
    # TensorFlow, whose CPU kernels and XLA flush them to 0.
    return jnp.concatenate([at_or_above[:-1] - at_or_above[1:], at_or_above[-1:]])


#: Elements from which a tensor is counted by the reduction: its scatter-add would write 1 MiB.
COUNTED_IN_ONE_REDUCTION_FROM = 2**17

#: -Inf, then each boundary a bucket starts at (`signed_boundaries`): float32 values, as Python
#: floats (exactly), constants of the program.
_BOUNDARIES = (-np.inf,) + tuple(float(bound) for bound in signed_boundaries())


def counts_by_scatter(values):
    """`log_magnitude_counts` by a scatter-add of each element's bucket (as before 2026-12-07)."""
    side = BUCKETS_PER_SIDE
    magnitude_edges = jnp.asarray(MAGNITUDE_EDGES)
    magnitude = jnp.abs(values)
    # The decade from a logarithm, then one step either way against the float32 edges
    # themselves: a logarithm off by an ulp never moves a value at an edge. Fused into
    # one loop by XLA: 3.5x faster on CPU than jnp.searchsorted (a loop of its own).
    per_natural_log = np.float32(BUCKETS_PER_DECADE / np.log(10.0))
    estimate = jnp.log(magnitude) * per_natural_log - LOWEST_DECADE * BUCKETS_PER_DECADE
    # 0, NaN and Inf give any index here: 0 is set below, NaN and Inf weigh 0.
    estimate = jnp.where(jnp.isfinite(estimate), estimate, 0.0)
    index = jnp.clip(jnp.floor(estimate).astype(jnp.int32), 0, side - 1)
    above = magnitude >= magnitude_edges[jnp.minimum(index + 1, side)]
    index += ((index < side - 1) & above).astype(jnp.int32)
    index -= ((index > 0) & (magnitude < magnitude_edges[index])).astype(jnp.int32)
    bucket = jnp.where(values > 0, side + 1 + index, side - 1 - index)
    # Subnormals count as 0, as on TensorFlow, whose CPU kernels and XLA flush them to 0.
    bucket = jnp.where(magnitude < SMALLEST_NORMAL, side, bucket)
    # Integer counts: a float32 count stops growing at 2**24 elements.
    finite = jnp.isfinite(values).astype(jnp.int32)
    return jnp.zeros([int(LOG_BUCKET_COUNT)], jnp.int32).at[bucket].add(finite, mode="promise_in_bounds")
