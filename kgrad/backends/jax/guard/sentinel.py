"""The guard's every-step sentinel on JAX: a pure function of ``(old state, new state, loss, gradients)``.

`guard_update` runs inside a jitted step (or eagerly, the same code): it
checks the loss and the weight gradients, keeps the state of before when one
of them is not finite (a select on the state tree: trainable,
non-trainable, optimizer and metrics variables alike) and records the trip in
a `GuardRecord`. `guard_apply` does the same for a step whose update has not
run yet: the update runs behind the check, in a ``lax.cond``, and costs no
select. Both record the trip in the `GuardRecord`, a few small device arrays
that travel from step to step. The host reads the record only when the flag
that comes back with it is set.

kgrad's guarded steps (`kgrad.backends.jax.guard.run`, Keras' own or a
model's own, probed or not) use its pieces (`tensor_checks`, `may_apply`,
`next_record`); a train step of one's own may call `guard_update` or
`guard_apply` around ``jax.value_and_grad``.

Example:

>>> import jax.numpy as jnp
>>> record = initial_record(2)
>>> old, new = {"w": jnp.ones(2)}, {"w": jnp.array([0.5, jnp.nan])}
>>> state, record = guard_update(old, new, jnp.float32(1.0), [jnp.array([jnp.inf, 0.0])],
...                              record, step=7)
>>> state["w"].tolist(), bool(record.tripped), int(record.trip_step), record.counts.tolist()
([1.0, 1.0], True, 7, [[0, 0], [0, 1]])
"""

import typing

import jax
import jax.numpy as jnp
import numpy as np

from kgrad.backends.jax.summarize.compiled import compiled_on_its_own
from kgrad.backends.jax.summarize.on_device import non_finite_counts_on_device
from kgrad.backends.jax.summarize.one_pass import on_several_devices


class GuardRecord(typing.NamedTuple):
    """What the sentinel keeps on the device between steps (one row per checked tensor).

    Attributes:
        tripped: Whether a step went non-finite since the last reset.
        trip_step: ``optimizer.iterations`` of that step (-1: none).
        trip_batch: Its batch index within the epoch (-1: none).
        counts: ``[tensors, 2]`` NaN and Inf counts of that step's tensors.
        last_finite_step: The latest step whose update was applied (-1: none).
        last_finite_squares: Sums of squares of that step's tensors.
        batch: The batch index, within the epoch, of the next step.
        spikes: The spike rule's `kgrad.backends.jax.guard.spikes.SpikeRecord`, or ``None``.
    """

    tripped: jax.Array
    trip_step: jax.Array
    trip_batch: jax.Array
    counts: jax.Array
    last_finite_step: jax.Array
    last_finite_squares: jax.Array
    batch: jax.Array
    spikes: object = None


def initial_record(count):
    """A `GuardRecord` for ``count`` checked tensors, before any step."""
    minus_one = jnp.asarray(-1, jnp.int32)
    return GuardRecord(
        tripped=jnp.asarray(False),
        trip_step=minus_one,
        trip_batch=minus_one,
        counts=jnp.zeros((count, 2), jnp.int32),
        last_finite_step=minus_one,
        last_finite_squares=jnp.zeros((count,), jnp.float32),
        batch=jnp.asarray(0, jnp.int32),
    )


def non_finite_counts(tensors):
    """``[len(tensors), 2]`` int32: the NaN and the Inf count of each tensor, counted on the host.

    For the branch of a step that is not clean: in NumPy, through one
    ``jax.pure_callback``, run only on the rare step that takes that branch.
    Counted by XLA in that branch, which a clean step never runs, the
    guarded step of the benchmark MLP still took 1.035–1.047 of Keras' step
    on CPU (1.026 counting in float32), against 0.99–1.005 counting here:
    XLA's CPU backend turns each integer sum into a tree of partial sums
    with scratch arrays the size of its tensor, and what the branch
    compiles to costs every step. Under a ``keras.distribution`` over
    several devices, where a host callback would first gather each tensor
    onto one device, they are counted on the devices that hold each tensor
    instead (`kgrad.backends.jax.summarize.on_device`): per-shard counts and
    an all-reduce of them.

    Example:

    >>> import jax.numpy as jnp
    >>> non_finite_counts([jnp.array([jnp.nan, jnp.inf, -jnp.inf]), jnp.ones(2)]).tolist()
    [[1, 2], [0, 0]]
    """
    if on_several_devices():
        return non_finite_counts_on_device(tensors)
    shape = jax.ShapeDtypeStruct((len(tensors), 2), jnp.int32)
    # Counts have no derivative: inside a differentiated function (a watched forward tensor) too.
    tensors = [jax.lax.stop_gradient(tensor) for tensor in tensors]
    return jax.pure_callback(_count_on_host, shape, *tensors, vmap_method="sequential")


def _count_on_host(*tensors):
    tensors = [np.asarray(tensor) for tensor in tensors]
    return np.array([[np.isnan(t).sum(), np.isinf(t).sum()] for t in tensors], np.int32).reshape(-1, 2)


def select_leaves(apply, new_state, old_state):
    """``new_state`` where ``apply``, else ``old_state``: one ``jnp.where`` per leaf (fused by XLA)."""
    return jax.tree.map(lambda new, old: jnp.where(apply, new, old), new_state, old_state)


def guard_update(old_state, new_state, loss, gradients, record, step, halt_updates=True,
                 select=select_leaves):
    """The state to keep after one step, and the guard's record of it.

    For a step whose update is already computed (a probed step, a model's
    own ``train_step``): a clean step costs one sum of squares per tensor
    and one select per state leaf (``select``). Keras' own step puts the
    update itself behind the check instead (`guard_apply`), which costs no
    select.

    Args:
        old_state: The state before the step (any pytree of arrays).
        new_state: The state the step computed (the same structure, shapes and dtypes).
        loss: The step's loss (unscaled).
        gradients: The weight gradients (a list of arrays, in the order of
            the names the record's rows stand for, after the loss).
        record: The `GuardRecord` of the steps before.
        step: The step's ``optimizer.iterations`` (a scalar).
        halt_updates: After a trip, keep the state of before on every later
            step too, until the record is reset (``action`` "stop"/"raise").
        select: ``fn(apply, new_state, old_state) -> state``: `select_leaves`
            (a ``jnp.where`` per leaf, which XLA fuses into the update that
            made the leaf), or a ``lax.cond`` of its own (for state that XLA
            would round differently once fused with the select).

    Returns:
        ``(state, record)``: ``new_state`` if the update may be applied, else
        ``old_state``; and the updated `GuardRecord`.
    """
    squares, counts = tensor_checks([loss] + list(gradients))
    apply = may_apply(counts, record, halt_updates)
    state = select(apply, new_state, old_state)
    return state, next_record(record, squares, counts, apply, step)


def guard_apply(loss, gradients, record, step, update, operands, old_state, halt_updates=True):
    """``(state, record, applied)``: ``update(operands)`` if the step is clean, else ``old_state``.

    The choice is one ``lax.cond``; ``applied`` is its predicate.

    The update (the optimizer's) runs only once every checked
    tensor is known to be finite, and writes its results in place: a clean
    step costs the sums of squares and the branch, no select over the state
    (on a 400k-weight MLP on CPU, ~0.04 of a step against ~0.2 with a
    ``jnp.where`` per leaf of weights and Adam's moments).

    Example:

    >>> import jax.numpy as jnp
    >>> state, record, applied = guard_apply(
    ...     jnp.float32(1.0), [jnp.array([jnp.nan])], initial_record(2), 3,
    ...     update=lambda w: {"w": w - 1.0}, operands=jnp.ones(2), old_state={"w": jnp.ones(2)})
    >>> state["w"].tolist(), bool(record.tripped), int(record.trip_step), bool(applied)
    ([1.0, 1.0], True, 3, False)
    """
    squares, counts = tensor_checks([loss] + list(gradients))
    apply = may_apply(counts, record, halt_updates)
    state = jax.lax.cond(apply, update, lambda _: old_state, operands)
    return state, next_record(record, squares, counts, apply, step), apply


def tensor_checks(tensors, unchecked=()):
    """``(squares [n], counts [n, 2])``: each tensor's sum of squares, and its NaN/Inf counts.

    The exact counts are computed only when a sum is not finite (a
    ``lax.cond``): a sum that overflowed while every element is finite is a
    clean step, whose update is applied. The tensors numbered in ``unchecked``
    (a loss scaler's gradients, `kgrad.backends.jax.guard.overflow`) have their
    sums only: their counts are 0, and they never make a step count its tensors.
    One compiled call (`kgrad.backends.jax.summarize.compiled`): in a step run op by op,
    the ``lax.cond`` was compiled again at every call.
    """
    return _tensor_checks(list(tensors), unchecked=tuple(unchecked))


@compiled_on_its_own(static_argnames=("unchecked",))
def _tensor_checks(tensors, unchecked):
    tensors = [jnp.asarray(t).astype(jnp.float32) for t in tensors]
    squares = jnp.stack([jnp.sum(jnp.square(t)) for t in tensors])
    finite = jnp.isfinite(squares)
    if unchecked:
        checked = jnp.asarray([number not in unchecked for number in range(len(tensors))])
        finite = finite | jnp.logical_not(checked)
    counts = jax.lax.cond(
        jnp.all(finite),
        lambda: jnp.zeros((len(tensors), 2), jnp.int32),
        lambda: non_finite_counts(tensors),
    )
    return squares, counts if not unchecked else jnp.where(checked[:, None], counts, 0)


def may_apply(counts, record, halt_updates):
    """Whether the step's update is applied: no NaN/Inf, and (``halt_updates``) no trip before."""
    apply = jnp.logical_not(jnp.any(counts > 0))
    if halt_updates:
        apply = jnp.logical_and(apply, jnp.logical_not(record.tripped))
    return apply


def next_record(record, squares, counts, apply, step):
    """The `GuardRecord` after a step with these sums and counts (``apply``: its update was applied)."""
    bad = jnp.any(counts > 0)
    first_trip = jnp.logical_and(bad, jnp.logical_not(record.tripped))
    step = jnp.asarray(step).astype(jnp.int32)
    return GuardRecord(
        tripped=jnp.logical_or(record.tripped, bad),
        trip_step=jnp.where(first_trip, step, record.trip_step),
        trip_batch=jnp.where(first_trip, record.batch, record.trip_batch),
        counts=jnp.where(first_trip, counts, record.counts),
        last_finite_step=jnp.where(apply, step, record.last_finite_step),
        last_finite_squares=jnp.where(apply, squares, record.last_finite_squares),
        batch=record.batch + 1,
        spikes=record.spikes,
    )


def select_state(apply, new_state, old_state, chosen=()):
    """Keras' ``(trainable, non-trainable, optimizer, metrics)``: the new state where ``apply``, else the old.

    A ``jnp.where`` per leaf, fused by XLA into the update that made it,
    except for the leaves in ``chosen`` (ids of values a ``lax.cond`` on the
    same ``apply`` made) and for the non-trainable variables: fused with the
    select, BatchNormalization's moving averages rounded differently from
    Keras' own step (an ulp); behind a ``lax.cond`` they are computed exactly
    as Keras computes them. One compiled call (`kgrad.backends.jax.summarize.compiled`).
    """
    passed = tuple(tuple(id(n) in chosen for n in new_state[k]) for k in range(4))
    return _selected_state(apply, list(new_state), list(old_state), passed=passed)


@compiled_on_its_own(static_argnames=("passed",))
def _selected_state(apply, new_state, old_state, passed):
    def select(new, old, kept):
        return [n if keep else jnp.where(apply, n, o) for n, o, keep in zip(new, old, kept)]

    trainable, optimizer, metrics = (select(new_state[k], old_state[k], passed[k]) for k in (0, 2, 3))
    return (trainable, jax.lax.cond(apply, lambda: new_state[1], lambda: old_state[1]), optimizer, metrics)


def dropped_after_trip(probe_records, tripped_before):
    """``{run: record}`` with step -1 after a trip: those steps keep the state of before, nothing to log.

    Keras' loop may run a few more steps before it sees the trip.
    """
    return {
        run: (jnp.where(tripped_before, -1, number), scalars, histograms)
        for run, (number, scalars, histograms) in probe_records.items()
    }
