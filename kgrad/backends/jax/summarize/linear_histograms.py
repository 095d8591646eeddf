"""Histograms in equal buckets between two bounds, inside a jitted JAX step, for a tensor of any shape.

The counts are a scatter-add of each element's bucket, with the tensor's own
shape: XLA partitions it as local counts summed across the devices that hold
the tensor (an all-reduce of ``k`` integers), where a flattened tensor would
first be gathered onto every device.

Example:

>>> import jax.numpy as jnp
>>> histogram_of(jnp.array([[0.0, 1.0], [3.0, 4.0]]), 0.0, 4.0, 2)[:, 2].tolist()
[2.0, 2.0]
"""

import jax.numpy as jnp


def empty_histogram(bucket_count):
    """A ``[bucket_count or 0, 3]`` stand-in: both branches of a cond return the same structure."""
    return jnp.zeros([bucket_count or 0, 3], jnp.float32)


def histogram_of(values, low, high, bucket_count, weights=None):
    """TensorBoard's ``[k, 3]`` histogram of float32 ``values`` in ``k`` equal buckets of [low, high].

    ``weights`` (int32, the shape of ``values``): what each element counts,
    1 if ``None`` (0 for the non-finite elements of the exact path).
    """
    low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
    degenerate = high <= low
    low, high = jnp.where(degenerate, low - 0.5, low), jnp.where(degenerate, high + 0.5, high)
    width = (high - low) / bucket_count
    edges = low + width * jnp.arange(bucket_count + 1, dtype=jnp.float32)
    edges = edges.at[-1].set(high)  # float rounding never cuts off the max
    if values.size:
        # Clipped as integers: even a NaN (converted to any integer) lands in range (the
        # exact path replaces the counts of a tensor holding one, or weighs it 0).
        index = jnp.clip(jnp.floor((values - low) / width).astype(jnp.int32), 0, bucket_count - 1)
        # Integer counts: a float32 count stops growing at 2**24 elements.
        ones = jnp.ones(values.shape, jnp.int32) if weights is None else weights
        # In range by the clip: promised, the scatter skips its bounds checks (~20% less on CPU).
        counts = jnp.zeros([bucket_count], jnp.int32).at[index].add(ones, mode="promise_in_bounds")
    else:
        counts = jnp.zeros([bucket_count], jnp.int32)
    return jnp.stack([edges[:-1], edges[1:], counts.astype(jnp.float32)], axis=1)
