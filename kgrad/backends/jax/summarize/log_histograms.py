"""Log-magnitude histograms inside a jitted JAX step, on the edges of `kgrad.plan.histogram_buckets`.

The edges are fixed, so a histogram needs no min/max pass and no branch on
non-finite elements: NaN and ±Inf get weight 0 (the non-finite count of the
moments row counts them), everything else the bucket of its sign and
magnitude, as TensorFlow's `kgrad.backends.tensorflow.summarize.histograms`
computes it.

Example:

>>> import jax.numpy as jnp
>>> counts = log_magnitude_histogram(jnp.array([0.0, 1.0, -1.0, jnp.nan]))[:, 2]
>>> int(counts.sum()), int(counts[LOG_BUCKET_COUNT // 2])  # 3 finite, 1 zero
(3, 1)
"""

import jax.numpy as jnp

from kgrad.plan.histogram_buckets import LOG_BUCKET_COUNT, log_magnitude_edges, signed_boundaries


def log_magnitude_histogram(x):
    """TensorBoard's ``[LOG_BUCKET_COUNT, 3]`` float32 histogram of ``x``'s finite elements."""
    edges = jnp.asarray(log_magnitude_edges())
    counts = log_magnitude_counts(jnp.ravel(x).astype(jnp.float32))
    return jnp.stack([edges[:-1], edges[1:], counts.astype(jnp.float32)], axis=1)


def log_magnitude_counts(values):
    """``[LOG_BUCKET_COUNT]`` int32 counts of the finite flat float32 ``values``."""
    buckets = int(LOG_BUCKET_COUNT)
    if values.size == 0:
        return jnp.zeros([buckets], jnp.int32)
    # Each value's bucket by one binary search in float32, exact at every edge: the
    # boundaries TensorFlow's Bucketize gets.
    bucket = jnp.searchsorted(jnp.asarray(signed_boundaries()), values, side="right").astype(jnp.int32)
    # NaN and Inf weigh 0. Integer counts: a float32 count stops growing at 2**24 elements.
    finite = jnp.isfinite(values).astype(jnp.int32)
    return jnp.zeros([buckets], jnp.int32).at[bucket].add(finite, mode="promise_in_bounds")
