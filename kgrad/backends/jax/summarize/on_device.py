"""The exact path's statistics and the guard's counts on the devices that hold a tensor, for a sharded step.

On one device the exact statistics of a tensor holding NaN or Inf
(`kgrad.backends.jax.summarize.careful`) and the guard's NaN/Inf counts
(`kgrad.backends.jax.guard.sentinel.non_finite_counts`) are computed on the
host, through a ``jax.pure_callback``. Under a ``keras.distribution`` a
tensor may span several devices (and, with several processes, devices that
this host cannot read), and a host callback first gathers its whole operand
onto one device. Here the same values are computed on the devices instead,
as masked reductions over the tensor's own shape: XLA partitions each into
per-shard partial results (sums, counts, min, max) and an all-reduce of
those few numbers. Nothing is gathered.

They are in float32, where the host's are in float64: the sums run over
values divided by the largest finite magnitude, so that no square
overflows, and agree with the host's to float32 rounding.

Example:

>>> import jax.numpy as jnp
>>> row, histogram = careful_summary_on_device(jnp.array([[jnp.nan, 1.0], [3.0, 0.0]]), 2, (0, 1, 3, 4, 5, 6))
>>> [round(float(row[i]), 3) for i in (1, 3, 4, 5, 6)]  # mean, min, max, zero fraction, non-finite
[1.333, 0.0, 3.0, 0.25, 1.0]
>>> histogram[:, 2].tolist()  # the finite elements in 2 buckets of [0, 3]
[2.0, 1.0]
"""

import jax
import jax.numpy as jnp

from kgrad.backends.jax.summarize.linear_histograms import empty_histogram, histogram_of
from kgrad.backends.jax.summarize.one_pass import (
    norm_from_sums, norm_parts, on_several_devices, reduce_in_one_pass,
)
from kgrad.plan.tag_names import MOMENT_NAMES

ROW = len(MOMENT_NAMES)
_NORM, _MEAN, _STD, _MIN, _MAX, _ZEROS, _NONFINITE = range(ROW)


def reducible(x):
    """``x`` as its statistics read it: flattened on one device, its own shape under a distribution.

    A reduction of a flattened tensor is what one device's probed step has
    always run (XLA's CPU backend reduces one axis fastest); under a
    ``keras.distribution`` a reshape would first gather a sharded tensor
    onto every device, and a reduction over its own axes is local partial
    results and an all-reduce of them.
    """
    return x if on_several_devices() else jnp.ravel(x)


def careful_summary_on_device(values, bucket_count, needed):
    """`kgrad.backends.jax.summarize.careful.careful_summary`, computed by XLA: ``(row [7], histogram)``.

    ``values`` is a float32 tensor of any shape (not flattened: a sharded
    tensor stays where it is). The ``needed`` columns of the row are
    computed (the others are NaN); the histogram counts the finite elements
    in ``bucket_count`` equal buckets between their min and max.
    """
    values = jax.lax.stop_gradient(values)
    finite = jnp.isfinite(values)
    # Each pass one reduction of several operands, whose masks XLA computes as it reads them
    # (`reduce_in_one_pass`).
    nan_count, finite_count, zero_count, scale, low, high = reduce_in_one_pass(
        (jnp.isnan(values), 0, jnp.add), (finite, 0, jnp.add), (values == 0, 0, jnp.add),
        (jnp.where(finite, jnp.abs(values), 0.0), 0.0, jnp.maximum),
        (jnp.where(finite, values, jnp.inf), jnp.inf, jnp.minimum),
        (jnp.where(finite, values, -jnp.inf), -jnp.inf, jnp.maximum),
    )
    scale = jnp.where(scale > 0, scale, 1.0)
    # The values over their largest magnitude summed (no overflow), and their norm, in one read: read
    # by two sums, ``values / scale`` was written out whole first.
    total, *squares = reduce_in_one_pass((jnp.where(finite, values / scale, 0.0), 0.0, jnp.add),
                                         *norm_parts(jnp.where(finite, values, 0.0)))
    divisor = jnp.maximum(finite_count, 1).astype(jnp.float32)
    mean = total / divisor * scale
    any_finite = finite_count > 0
    row = [jnp.float32(jnp.nan)] * ROW
    norm = norm_from_sums(*squares)
    row[_NORM] = jnp.where(nan_count > 0, jnp.nan, jnp.where(finite_count < values.size, jnp.inf, norm))
    row[_MEAN] = mean
    if _STD in needed:
        deviation = jnp.where(finite, values / scale - mean / scale, 0.0)
        (spread,) = reduce_in_one_pass((jnp.square(deviation), 0.0, jnp.add))
        row[_STD] = jnp.sqrt(spread / divisor) * scale
    low = jnp.where(any_finite, low, 0.0)
    high = jnp.where(any_finite, high, 0.0)
    row[_MIN], row[_MAX] = low, high
    row[_ZEROS] = zero_count.astype(jnp.float32) / max(values.size, 1)
    row[_NONFINITE] = (values.size - finite_count).astype(jnp.float32)
    row = [value if column in needed else jnp.float32(jnp.nan) for column, value in enumerate(row)]
    row = jnp.stack([jnp.asarray(value, jnp.float32) for value in row])
    histogram = empty_histogram(bucket_count)
    if bucket_count is not None:
        histogram = histogram_of(values, low, high, bucket_count, weights=finite.astype(jnp.int32))
    return row, histogram


def non_finite_counts_on_device(tensors):
    """``[len(tensors), 2]`` int32: the NaN and the Inf count of each tensor, reduced where it lives.

    Example:

    >>> non_finite_counts_on_device([jnp.array([[jnp.nan, jnp.inf], [-jnp.inf, 1.0]])]).tolist()
    [[1, 2]]
    """
    tensors = [jax.lax.stop_gradient(tensor) for tensor in tensors]
    return jnp.stack([jnp.stack(reduce_in_one_pass((jnp.isnan(t), 0, jnp.add), (jnp.isinf(t), 0, jnp.add)))
                      for t in tensors])
