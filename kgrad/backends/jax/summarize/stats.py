"""Moments and histograms of tensors inside a jitted JAX step, with the meaning TensorFlow's have.

A row of moments is `kgrad.plan.tag_names.MOMENT_NAMES`: the L2 norm of every
element (NaN when one is NaN, else Inf when one is Inf), then the mean,
population standard deviation, min and max of the finite elements (0 when
there is none), the fraction of all elements that are exactly zero, and the
number of non-finite elements. A histogram is TensorBoard's ``[k, 3]`` (left
edge, right edge, count) over the finite elements, between their min and max
(widened by 0.5 each side when they are equal). Values are divided by their
largest finite magnitude before squaring, so that gradients beyond 1e19 keep a
finite norm, as `kgrad.backends.tensorflow.summarize.stats` keeps it.

Example:

>>> import jax.numpy as jnp
>>> [round(float(v), 3) for v in moments(jnp.array([0.0, 3.0, 4.0]))]
[5.0, 2.333, 1.7, 0.0, 4.0, 0.333, 0.0]
"""

import jax
import jax.numpy as jnp

from kgrad.plan.tag_names import MOMENT_NAMES

ROW = len(MOMENT_NAMES)


def moments(x):
    """The ``[7]`` float32 row of moments of ``x`` (any float dtype and shape)."""
    return summarize(x, None)[0]


def summarize(x, bucket_count):
    """``(moments [7], histogram [bucket_count, 3] or None)`` of ``x``, in float32."""
    values = jnp.ravel(x).astype(jnp.float32)
    size = values.size
    if size == 0:
        histogram = None if bucket_count is None else _histogram_of(values, 0.0, 0.0, bucket_count)
        return jnp.zeros([ROW], jnp.float32), histogram
    finite = jnp.isfinite(values)
    count = jnp.sum(finite.astype(jnp.int32))
    nonfinite = (size - count).astype(jnp.float32)
    safe = jnp.where(finite, values, 0.0)
    scale = jnp.max(jnp.abs(safe))
    scale = jnp.where(scale > 0, scale, 1.0)
    divisor = jnp.maximum(count, 1).astype(jnp.float32)
    mean = jnp.sum(safe / scale) / divisor * scale
    centered = jnp.where(finite, values - mean, 0.0)
    centered_scale = jnp.max(jnp.abs(centered))
    centered_scale = jnp.where(centered_scale > 0, centered_scale, 1.0)
    std = jnp.sqrt(jnp.sum(jnp.square(centered / centered_scale)) / divisor) * centered_scale
    norm = jnp.sqrt(jnp.sum(jnp.square(safe / scale))) * scale
    # A tensor holding NaN (or Inf) has a NaN (or Inf) norm, whatever its finite elements.
    norm = jnp.where(jnp.any(jnp.isnan(values)), jnp.nan, jnp.where(nonfinite > 0, jnp.inf, norm))
    has_finite = count > 0
    minimum = jnp.where(has_finite, jnp.min(jnp.where(finite, values, jnp.inf)), 0.0)
    maximum = jnp.where(has_finite, jnp.max(jnp.where(finite, values, -jnp.inf)), 0.0)
    # Counted as integers: a float32 sum of ones stops growing at 2**24.
    zero_fraction = jnp.sum((values == 0).astype(jnp.int32)).astype(jnp.float32) / size
    row = jnp.stack([norm, mean, std, minimum, maximum, zero_fraction, nonfinite]).astype(jnp.float32)
    histogram = (
        None if bucket_count is None else _histogram_of(values, minimum, maximum, bucket_count, finite)
    )
    return row, histogram


def summarize_many(tensors, bucket_count=None):
    """``([n, 7] moments, [n, bucket_count, 3] histograms or None)`` of a list of tensors."""
    if not tensors:
        histograms = None if bucket_count is None else jnp.zeros([0, bucket_count, 3], jnp.float32)
        return jnp.zeros([0, ROW], jnp.float32), histograms
    pairs = [summarize(tensor, bucket_count) for tensor in tensors]
    histograms = None if bucket_count is None else jnp.stack([pair[1] for pair in pairs])
    return jnp.stack([pair[0] for pair in pairs]), histograms


def _histogram_of(values, low, high, bucket_count, finite=None):
    """TensorBoard's ``[k, 3]`` histogram of the finite ``values`` in ``k`` equal buckets of [low, high]."""
    low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
    degenerate = high <= low
    low, high = jnp.where(degenerate, low - 0.5, low), jnp.where(degenerate, high + 0.5, high)
    width = (high - low) / bucket_count
    edges = low + width * jnp.arange(bucket_count + 1, dtype=jnp.float32)
    edges = edges.at[-1].set(high)  # float rounding never cuts off the max
    if values.size:
        index = jnp.clip(jnp.floor((jnp.where(finite, values, low) - low) / width), 0, bucket_count - 1)
        counts = jax.ops.segment_sum(finite.astype(jnp.int32), index.astype(jnp.int32), bucket_count)
    else:
        counts = jnp.zeros([bucket_count], jnp.int32)
    return jnp.stack([edges[:-1], edges[1:], counts.astype(jnp.float32)], axis=1)
