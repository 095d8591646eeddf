"""The exact statistics of tensors holding NaN or Inf, or whose squares overflow float32: on the host.

`kgrad.backends.jax.summarize.stats` computes moments and histograms with
plain reductions, which XLA fuses with what made each tensor. When a tensor's
sum of squares is not finite, a ``lax.cond`` replaces them by these, which
`careful_summaries` computes in NumPy through one ``jax.pure_callback``.

Why on the host: the branch holding the exact path is compiled into every
probed step, whether it runs or not. Written in JAX (each reduction masked,
each sum rescaled), it was most of what compiling a probed step added to the
host's peak memory (+160 of +210 MB on the benchmark MLP). As one callback it
is a single call in the compiled step, and it runs only on the rare step it is
needed. Under a ``keras.distribution`` over several devices a host callback
would first gather each whole tensor onto one device: there the same values
are computed on the devices that hold the tensor
(`kgrad.backends.jax.summarize.on_device`). In float64 the square of any
float32 is finite, so the norm needs no rescaling. The histogram's bucket
indices are computed in float32 with the fast path's arithmetic
(`linear_histograms.histogram_of`), so that both bucket an element
alike (its edges agree to a float32 rounding: XLA may fuse a multiply-add).

Example:

>>> import numpy as np
>>> row, histogram = careful_summary(np.array([np.nan, 1.0, 3.0], np.float32), 2, (0, 1, 3, 4, 6))
>>> row.tolist()  # norm, mean, std (not asked), min, max, zero fraction (not asked), non-finite
[nan, 2.0, nan, 1.0, 3.0, nan, 1.0]
>>> histogram.tolist()  # left edge, right edge, count of the finite elements
[[1.0, 2.0, 1.0], [2.0, 3.0, 1.0]]
"""

import functools

import jax
import numpy as np

from kgrad.backends.jax.summarize.on_device import careful_summary_on_device
from kgrad.backends.jax.summarize.one_pass import on_several_devices
from kgrad.plan.tag_names import MOMENT_NAMES

ROW = len(MOMENT_NAMES)
_NORM, _MEAN, _STD, _MIN, _MAX, _ZEROS, _NONFINITE = range(ROW)


def careful_summary(values, bucket_count, needed):
    """``(row [7] float32, histogram [bucket_count or 0, 3] float32)`` of flat float32 ``values``.

    The ``needed`` columns of the row (`MOMENT_NAMES`; the others are NaN):
    the norm is NaN when an element is NaN, else Inf when one is Inf; the
    mean, population standard deviation, min and max are of the finite
    elements (0 when there is none). The histogram counts the finite
    elements in ``bucket_count`` equal buckets between their min and max.
    """
    values = np.asarray(values, np.float32).ravel()  # (any shape)
    finite = np.isfinite(values)
    safe = values[finite].astype(np.float64)
    count = safe.size
    row = np.full([ROW], np.nan)
    row[_NONFINITE] = values.size - count
    if np.isnan(values).any():
        row[_NORM] = np.nan
    else:
        row[_NORM] = np.inf if count < values.size else np.sqrt(np.sum(np.square(safe)))
    mean = np.sum(safe) / max(count, 1)
    row[_MEAN] = mean
    row[_STD] = np.sqrt(np.sum(np.square(safe - mean)) / max(count, 1))
    row[_MIN] = np.min(safe) if count else 0.0
    row[_MAX] = np.max(safe) if count else 0.0
    row[_ZEROS] = np.count_nonzero(values == 0) / values.size
    histogram = np.zeros([bucket_count or 0, 3], np.float32)
    if bucket_count is not None:
        histogram = _histogram(values[finite], np.float32(row[_MIN]), np.float32(row[_MAX]), bucket_count)
    unasked = [column for column in range(ROW) if column not in needed]
    row[unasked] = np.nan
    return row.astype(np.float32), histogram


def _histogram(finite_values, low, high, bucket_count):
    """TensorBoard's ``[k, 3]`` histogram, in float32 as `kgrad.backends.jax.summarize.stats` computes it."""
    if high <= low:
        low, high = low - np.float32(0.5), high + np.float32(0.5)
    width = (high - low) / np.float32(bucket_count)
    edges = low + width * np.arange(bucket_count + 1, dtype=np.float32)
    edges[-1] = high
    index = np.floor((finite_values - low) / width)
    index = np.clip(np.nan_to_num(index, nan=0.0, posinf=bucket_count, neginf=0.0), 0, bucket_count - 1)
    counts = np.bincount(index.astype(np.int64), minlength=bucket_count)[:bucket_count]
    return np.stack([edges[:-1], edges[1:], counts.astype(np.float32)], axis=1)


def careful_summaries(values, bucket_counts, needed):
    """`careful_summary` of each float32 tensor in ``values``, on the host, from inside a jitted step.

    ``bucket_counts`` and ``needed`` hold each tensor's bucket count (or
    ``None``) and needed columns. Returns ``[(row, histogram)]`` device arrays.
    Under a distribution over several devices, computed on them instead
    (`kgrad.backends.jax.summarize.on_device`): nothing is gathered.
    """
    if on_several_devices():
        return [careful_summary_on_device(v, b, n) for v, b, n in zip(values, bucket_counts, needed)]
    shapes = [
        (jax.ShapeDtypeStruct([ROW], np.float32), jax.ShapeDtypeStruct([buckets or 0, 3], np.float32))
        for buckets in bucket_counts
    ]
    callback = functools.partial(_on_host, tuple(bucket_counts), tuple(tuple(sorted(n)) for n in needed))
    # Statistics are not differentiated, but an activation's are taken inside the
    # differentiated forward pass, where a callback without a gradient must see none.
    values = [jax.lax.stop_gradient(value) for value in values]
    # "sequential": under jax.vmap the callback runs once per element of the mapped axis.
    return jax.pure_callback(callback, shapes, values, vmap_method="sequential")


def _on_host(bucket_counts, needed, values):
    return [careful_summary(v, b, n) for v, b, n in zip(values, bucket_counts, needed)]
