"""Moments and histograms of tensors inside a jitted JAX step, with the meaning TensorFlow's have.

A row of moments is `kgrad.plan.tag_names.MOMENT_NAMES`: the L2 norm of every
element (NaN when one is NaN, else Inf when one is Inf), then the mean,
population standard deviation, min and max of the finite elements (0 when
there is none), the fraction of all elements that are exactly zero, and the
number of non-finite elements. A histogram is TensorBoard's ``[k, 3]`` (left
edge, right edge, count) over the finite elements, between their min and max
(widened by 0.5 each side when they are equal), or on the fixed log-magnitude
edges of `kgrad.plan.histogram_buckets` when the bucket count is its
``LOG_BUCKET_COUNT``.

Each is computed with plain reductions, fused with what made the tensor
(under a ``keras.distribution``, over the tensor's own shape, never
flattened: a reduction of a sharded tensor is then local partial results and
an all-reduce of them, where a flattened one is first gathered onto every
device; `kgrad.backends.jax.summarize.on_device.reducible`); when
its sum of squares is not finite (a NaN, an Inf, or squares beyond float32:
gradients beyond 1e19), a ``lax.cond`` replaces them by the exact values of
`kgrad.backends.jax.summarize.careful`, computed on the host in float64.

Example:

>>> import jax.numpy as jnp
>>> [round(float(v), 3) for v in moments(jnp.array([0.0, 3.0, 4.0]))]
[5.0, 2.333, 1.7, 0.0, 4.0, 0.333, 0.0]
"""

import jax
import jax.numpy as jnp

from kgrad.backends.jax.summarize.careful import careful_summaries
from kgrad.backends.jax.summarize.linear_histograms import empty_histogram, histogram_of
from kgrad.backends.jax.summarize.log_histograms import log_magnitude_histogram
from kgrad.backends.jax.summarize.on_device import reducible
from kgrad.plan.histogram_buckets import is_log_magnitude_count
from kgrad.plan.tag_names import MOMENT_NAMES

ROW = len(MOMENT_NAMES)
ALL_COLUMNS = tuple(range(ROW))
_NORM, _MEAN, _STD, _MIN, _MAX, _ZEROS, _NONFINITE = ALL_COLUMNS


def moments(x):
    """The ``[7]`` float32 row of moments of ``x`` (any float dtype and shape)."""
    return summarize(x, None)[0]


def summarize(x, bucket_count, columns=ALL_COLUMNS):
    """``(moments [7], histogram [bucket_count, 3] or None)`` of ``x``, in float32.

    Only ``columns`` of the row are computed (the others are NaN, for rows
    whose tags are not written). They are computed unmasked, outside any
    branch, where XLA fuses them with what made the tensor; a tensor's sum
    of squares then decides whether they stand or the exact path
    (`kgrad.backends.jax.summarize.careful`, one host call) replaces them,
    in a ``lax.cond`` whose first branch only passes them on. A probed
    step's weight gradients need a norm and a histogram, not seven moments:
    0.07 ms against 1.3 ms for a 200k-element gradient on CPU.
    """
    if is_log_magnitude_count(bucket_count):
        # Fixed edges: the histogram needs neither the min and max nor the exact path.
        return summarize(x, None, columns)[0], log_magnitude_histogram(x)
    values = reducible(jnp.asarray(x).astype(jnp.float32))
    if values.size == 0:
        histogram = None if bucket_count is None else histogram_of(values, 0.0, 0.0, bucket_count)
        return jnp.zeros([ROW], jnp.float32), histogram
    needed = set(columns) | ({_MIN, _MAX} if bucket_count is not None else set())
    squares = jnp.sum(jnp.square(values))

    # Garbage where an element is not finite (the histogram's index is clipped, never out of range).
    fast = _plain_summary(values, squares, needed, bucket_count)
    row, histogram = jax.lax.cond(
        jnp.isfinite(squares), lambda: fast, lambda: careful_summaries([values], [bucket_count], [needed])[0]
    )
    return row, (None if bucket_count is None else histogram)


def summarize_group(items):
    """`summarize` of several tensors behind one branch: ``[(row, histogram or None)]``.

    ``items`` is ``[(x, bucket_count, columns)]``. The fast path of every
    tensor is computed; one ``lax.cond`` on all their sums of squares
    replaces them all by the exact path when one is not finite (exact for
    the finite ones too, in the asked columns). One branch instead of one per tensor: a probed
    MLP step's weight gradients and activations, 15 branches, are 2; each
    branch costs a wait on a CPU.
    """
    results = [None] * len(items)
    values, fast, squares = [], [], []
    log_histograms = {}
    for index, (x, bucket_count, columns) in enumerate(items):
        if is_log_magnitude_count(bucket_count):
            # Fixed edges: only the moments go through the branch.
            log_histograms[index] = log_magnitude_histogram(x)
            bucket_count = None
        tensor = reducible(jnp.asarray(x).astype(jnp.float32))  # (see the module's docstring)
        if tensor.size == 0:
            results[index] = summarize(tensor, bucket_count, columns)
            continue
        needed = set(columns) | ({_MIN, _MAX} if bucket_count is not None else set())
        squares.append(jnp.sum(jnp.square(tensor)))
        values.append((index, tensor, bucket_count, needed))
        fast.append(_plain_summary(tensor, squares[-1], needed, bucket_count))
    if values:
        exact = jax.lax.cond(
            jnp.all(jnp.isfinite(jnp.stack(squares))),
            lambda: fast,
            lambda: careful_summaries(
                [tensor for _, tensor, _, _ in values],
                [buckets for _, _, buckets, _ in values],
                [needed for _, _, _, needed in values],
            ),
        )
        for (index, _, bucket_count, _), (row, histogram) in zip(values, exact):
            results[index] = (row, None if bucket_count is None else histogram)
    for index, histogram in log_histograms.items():
        results[index] = (results[index][0], histogram)
    return results


def _plain_summary(values, squares, needed, bucket_count):
    """The needed moments of finite values whose squares do not overflow, each in one pass."""
    size = values.size
    row = [jnp.sqrt(squares)] + [jnp.float32(jnp.nan)] * (ROW - 1)
    if needed & {_MEAN, _STD}:
        row[_MEAN] = jnp.sum(values) / size
    if _STD in needed:
        row[_STD] = jnp.sqrt(jnp.mean(jnp.square(values - row[_MEAN])))
    if _MIN in needed:
        row[_MIN] = jnp.min(values)
    if _MAX in needed:
        row[_MAX] = jnp.max(values)
    if _ZEROS in needed:
        row[_ZEROS] = jnp.sum((values == 0).astype(jnp.int32)).astype(jnp.float32) / size
    row[_NONFINITE] = jnp.float32(0.0)
    row = jnp.stack([jnp.asarray(value, jnp.float32) for value in row])
    histogram = empty_histogram(bucket_count)
    if bucket_count is not None:
        histogram = histogram_of(values, row[_MIN], row[_MAX], bucket_count)
    return row, histogram
