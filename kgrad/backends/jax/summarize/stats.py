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

The moments of a tensor are one reduction of several operands
(`one_pass_totals`; the standard deviation a second), fused with what made
the tensor (under a ``keras.distribution``, over the tensor's own shape,
never flattened: a reduction of a sharded tensor is then local partial
results and an all-reduce of them, where a flattened one is first gathered
onto every device; `kgrad.backends.jax.summarize.on_device.reducible`).
On one device, when its sum of squares is not finite (a NaN, an Inf, or
squares beyond float32: gradients beyond 1e19), a ``lax.cond`` replaces them
by the exact values of `kgrad.backends.jax.summarize.careful`, computed on
the host in float64; under a distribution over several devices the exact
values, computed on the devices, are the only ones (`summarize_group`).

Example:

>>> import jax.numpy as jnp
>>> [round(float(v), 3) for v in moments(jnp.array([0.0, 3.0, 4.0]))]
[5.0, 2.333, 1.7, 0.0, 4.0, 0.333, 0.0]
"""

import jax
import jax.numpy as jnp

from kgrad.backends.common.norms import squares_are_exact
from kgrad.backends.jax.summarize.careful import careful_summaries
from kgrad.backends.jax.summarize.compiled import compiled_on_its_own
from kgrad.backends.jax.summarize.linear_histograms import empty_histogram, histogram_of
from kgrad.backends.jax.summarize.log_histograms import log_magnitude_histogram
from kgrad.backends.jax.summarize.on_device import reducible
from kgrad.backends.jax.summarize.one_pass import on_several_devices, reduce_in_one_pass
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
    whose tags are not written). On one device they are computed unmasked,
    outside any branch, where XLA fuses them with what made the tensor; a
    tensor's sum of squares then decides whether they stand or the exact
    path (`kgrad.backends.jax.summarize.careful`, one host call) replaces
    them, in a ``lax.cond`` whose first branch only passes them on. A probed
    step's weight gradients need a norm and a histogram, not seven moments:
    0.07 ms against 1.3 ms for a 200k-element gradient on CPU. Under a
    ``keras.distribution`` over several devices, see `summarize_group`.
    """
    return summarize_group([(x, bucket_count, columns)])[0]


def summarize_group(items):
    """`summarize` of several tensors behind one branch: ``[(row, histogram or None)]``.

    A compiled call of its own (`kgrad.backends.jax.summarize.compiled`),
    keyed on the shapes, bucket counts and columns: in a step run op by op,
    one program instead of a compile and a dispatch of each of its dozens of
    operations.

    ``items`` is ``[(x, bucket_count, columns)]``. The fast path of every
    tensor is computed; one ``lax.cond`` on all their sums of squares
    replaces them all by the exact path when one is not finite (exact for
    the finite ones too, in the asked columns). One branch instead of one per tensor: a probed
    MLP step's weight gradients and activations, 15 branches, are 2; each
    branch costs a wait on a CPU.

    Under a ``keras.distribution`` over several devices there is no branch:
    the exact path, computed on the devices
    (`kgrad.backends.jax.summarize.on_device`), is the only one. A branch
    never taken still holds memory in the compiled step (XLA's CPU backend
    gave the exact path's branch scratch arrays and copies of the tensors it
    reads), and the exact path on the devices is a few reductions more, not
    a host call.
    """
    specs = tuple((bucket_count, tuple(columns)) for _, bucket_count, columns in items)
    return _summarize_compiled([x for x, _, _ in items], specs=specs)


@compiled_on_its_own(static_argnames=("specs",))
def _summarize_compiled(arrays, specs):
    results = [None] * len(specs)
    items = [(x, *spec) for x, spec in zip(arrays, specs)]
    pending = []  # (index, float32 tensor, bucket count or None, needed columns)
    log_histograms = {}
    for index, (x, bucket_count, columns) in enumerate(items):
        if is_log_magnitude_count(bucket_count):
            # Fixed edges: the histogram needs neither the min and max nor the exact path.
            log_histograms[index] = log_magnitude_histogram(x)
            bucket_count = None
        tensor = reducible(jnp.asarray(x).astype(jnp.float32))  # (see the module's docstring)
        if tensor.size == 0:
            histogram = None if bucket_count is None else histogram_of(tensor, 0.0, 0.0, bucket_count)
            results[index] = (jnp.zeros([ROW], jnp.float32), histogram)
            continue
        needed = set(columns) | ({_MIN, _MAX} if bucket_count is not None else set())
        pending.append((index, tensor, bucket_count, needed))
    if pending:
        _, tensors, bucket_counts, needed = zip(*pending)
        summaries = _fast_or_exact(tensors, bucket_counts, needed)
        for (index, _, bucket_count, _), (row, histogram) in zip(pending, summaries):
            results[index] = (row, None if bucket_count is None else histogram)
    for index, histogram in log_histograms.items():
        results[index] = (results[index][0], histogram)
    return results


def _fast_or_exact(tensors, bucket_counts, needed):
    """``[(row, histogram)]`` of non-empty float32 ``tensors``: the fast path, or the exact one if needed."""
    if on_several_devices():
        return careful_summaries(list(tensors), list(bucket_counts), list(needed))
    totals = [one_pass_totals(tensor, columns) for tensor, columns in zip(tensors, needed)]
    # Garbage where an element is not finite (the histogram's index is clipped, never out of range).
    fast = [_plain_summary(*arguments) for arguments in zip(tensors, totals, needed, bucket_counts)]
    # Finite, and not so small that squares flushed to 0 could weigh (`squares_are_exact`): a
    # gradient that vanished to 1e-22 would read a norm and std of 0.
    exact = [squares_are_exact(total["squares"], tensor.size, total["largest"])
             for tensor, total in zip(tensors, totals)]
    return jax.lax.cond(
        jnp.all(jnp.stack(exact)),
        lambda: fast,
        lambda: careful_summaries(list(tensors), list(bucket_counts), list(needed)),
    )


def one_pass_totals(values, needed):
    """``{name: total}`` of float32 ``values`` for the ``needed`` columns, in one pass.

    Always ``"squares"`` (the sum of squares) and ``"largest"`` (the largest
    magnitude); ``"sum"`` for the mean or the standard deviation, ``"min"``,
    ``"max"``, and ``"zeros"`` (an int32
    count: a float32 count stops growing at 2**24 elements). One reduction
    reads the tensor once: as one reduction each, XLA's CPU backend wrote
    out a tensor read by several of them (its zero mask, whole, as int32) in
    a scratch array the size of the tensor (`docs/sharded.md`, "What it costs").

    Example:

    >>> import jax.numpy as jnp
    >>> totals = one_pass_totals(jnp.array([[0.0, -3.0], [4.0, 0.0]]), {_MEAN, _MIN, _ZEROS})
    >>> {name: float(total) for name, total in sorted(totals.items())}
    {'largest': 4.0, 'min': -3.0, 'squares': 25.0, 'sum': 1.0, 'zeros': 2.0}
    """
    parts = {"squares": (jnp.square(values), 0.0, jnp.add), "largest": (jnp.abs(values), 0.0, jnp.maximum)}
    if needed & {_MEAN, _STD}:
        parts["sum"] = (values, 0.0, jnp.add)
    if _MIN in needed:
        parts["min"] = (values, jnp.inf, jnp.minimum)
    if _MAX in needed:
        parts["max"] = (values, -jnp.inf, jnp.maximum)
    if _ZEROS in needed:
        parts["zeros"] = (values == 0, 0, jnp.add)
    return dict(zip(parts, reduce_in_one_pass(*parts.values())))


def _plain_summary(values, totals, needed, bucket_count):
    """The needed moments of finite values whose squares do not overflow, from `one_pass_totals`."""
    size = values.size
    row = [jnp.sqrt(totals["squares"])] + [jnp.float32(jnp.nan)] * (ROW - 1)
    if needed & {_MEAN, _STD}:
        row[_MEAN] = totals["sum"] / size
    if _STD in needed:
        # A second read: one-pass variance formulas lose the spread of values far from 0.
        row[_STD] = jnp.sqrt(jnp.mean(jnp.square(values - row[_MEAN])))
    if _MIN in needed:
        row[_MIN] = totals["min"]
    if _MAX in needed:
        row[_MAX] = totals["max"]
    if _ZEROS in needed:
        row[_ZEROS] = totals["zeros"].astype(jnp.float32) / size
    row[_NONFINITE] = jnp.float32(0.0)
    row = jnp.stack([jnp.asarray(value, jnp.float32) for value in row])
    histogram = empty_histogram(bucket_count)
    if bucket_count is not None:
        histogram = histogram_of(values, row[_MIN], row[_MAX], bucket_count)
    return row, histogram
