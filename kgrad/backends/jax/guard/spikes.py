"""The spike rule inside JAX's guarded step: a `SpikeRecord` that travels from step to step.

Pure functions of the record, as `kgrad.backends.jax.guard.sentinel`'s: `judge`
says whether the step spikes (the logarithms of its loss and gradient norm;
`kgrad.plan.spike_rule` is the NumPy reference),
the guard then keeps the state of before exactly as for a non-finite step,
and `after_step` writes the window, the streak and the step's row. In the
branch of a spiking step only (a ``lax.cond``), `skip_table` computes the
update the step would have made (``stateless_apply``, never kept) and the
per-weight values of the skip. Host side, `SpikeReads` reads a record (Keras'
step's, or one per part of a model's own step) only once the device has
counted a skip not read yet, never waiting for it.

Example:

>>> import jax.numpy as jnp
>>> from kgrad.plan.spike_rule import SpikeRule
>>> rule = SpikeRule(sigmas=6, window=4, row_capacity=8)
>>> record = initial_record(rule, 1)
>>> for loss in (1.0, 1.1, 0.9, 1.0):
...     judged = judge(record, rule, jnp.float32(loss), jnp.array([1.0]))
...     record = after_step(record, rule, judged, accepted=jnp.logical_not(judged[1]))
>>> bool(judge(record, rule, jnp.float32(9.0), jnp.array([1.0]))[1])
True
"""

import jax
import jax.numpy as jnp
import numpy as np

from kgrad.backends.jax.guard.sentinel import select_leaves
from kgrad.backends.jax.guard import spike_samples
from kgrad.backends.jax.guard.spike_record import SKIP_COUNT, SpikeRecord
from kgrad.backends.jax.summarize.compiled import compiled_on_its_own
from kgrad.plan.spike_rule import (
    MIN_LOG_SIGMA, ROW_COLUMNS, SAMPLED_VALUES, SKIP_COLUMNS, SKIP_SLOTS, SpikeSnapshot, sample_slots,
)


def initial_record(rule, weights):
    """The `SpikeRecord` before any step, for ``weights`` checked weight gradients."""
    rows = max(weights, 1)
    return SpikeRecord.zeros({
        "window": (rule.window, 2 + weights), "rows": (rule.row_capacity, len(ROW_COLUMNS)),
        "skip_values": (SKIP_SLOTS, rows, len(SKIP_COLUMNS)),
        "samples": (sample_slots(rule), rows, len(SAMPLED_VALUES)),
    }, skip_slots=SKIP_SLOTS)


@compiled_on_its_own(static_argnames=("rule",))
def judge(record, rule, loss, weight_squares, gradients_finite=None):
    """``(values, spike, score, mean, std)`` of one step (see the TensorFlow `SpikeState.judge`).

    ``values`` are the window's row: ln loss (NaN for a loss that is not positive), ln global
    norm, then each weight's gradient norm as it is (its z-scores rank weights, decide nothing).
    ``gradients_finite``: every element of the gradients is finite (``None``: unknown); then a
    global norm beyond float32's sum of squares spikes, in the warm-up too, with a score of +Inf
    (no window is needed to call it one, and applied, its update wrecks the run).
    """
    raw = jnp.concatenate([
        jnp.stack([jnp.asarray(loss, jnp.float32), jnp.sqrt(jnp.sum(weight_squares))]),
        jnp.sqrt(weight_squares.astype(jnp.float32)),
    ])
    logs = jnp.log(jnp.maximum(raw[:2], jnp.finfo(jnp.float32).tiny))
    values = jnp.concatenate([jnp.where(raw[:1] > 0, logs[:1], jnp.nan), logs[1:], raw[2:]])
    filled = jnp.minimum(record.accepted, rule.window)
    count = filled.astype(jnp.float32)
    in_window = (jnp.arange(rule.window) < filled).astype(jnp.float32)[:, None]
    mean = jnp.sum(record.window * in_window, 0) / jnp.maximum(count, 1.0)
    variance = jnp.sum(jnp.square((record.window - mean) * in_window), 0) / jnp.maximum(count - 1.0, 1.0)
    enough = filled >= 2
    mean, std = jnp.where(enough, mean, jnp.nan), jnp.where(enough, jnp.sqrt(variance), jnp.nan)
    z = (values[:2] - mean[:2]) / jnp.maximum(std[:2], MIN_LOG_SIGMA)
    judged = (filled >= rule.warmup) & jnp.isfinite(z)
    score = jnp.max(jnp.where(judged, z, -jnp.inf))
    spike = jnp.all(jnp.isfinite(raw)) & (score > rule.sigmas)
    score = jnp.where(jnp.any(judged), score, jnp.nan)
    if gradients_finite is not None:  # squares that overflowed: ln of the norm cannot be taken from them
        beyond = jnp.isinf(raw[1]) & jnp.isfinite(raw[0]) & gradients_finite
        spike, score = spike | beyond, jnp.where(beyond, jnp.inf, score)
    return values, spike, score, mean, std


@compiled_on_its_own(static_argnames=("rule",))
def after_step(record, rule, judged, accepted, overflowed=None):
    """The record after the step's decision: window row, streak, trip and the step's row.

    Steps are numbered by the rows: every step run since the fit began,
    skipped ones too (``optimizer.iterations`` does not count a skipped step).
    A step whose scaled gradients ``overflowed`` (a loss scaler skipped it) is
    not accepted: out of the window, the streak as it was, not skipped in its row.
    """
    values, spike, score, mean, std = judged
    row_accepted = accepted
    if overflowed is not None:
        accepted = accepted & jnp.logical_not(overflowed)
    slot = record.accepted % rule.window
    streak = jnp.where(spike, record.streak + 1, jnp.where(accepted, 0, record.streak))
    row = jnp.stack([
        record.row_count.astype(jnp.float32), 1.0 - row_accepted.astype(jnp.float32), score,
        mean[0], std[0], mean[1], std[1],
    ])
    record = record.with_row("window", slot, jnp.where(accepted, values, record.window[slot]))
    record = record.with_row("rows", record.row_count, row)
    return record._replace(
        accepted=record.accepted + accepted.astype(jnp.int32), streak=streak,
        tripped=record.tripped | (streak >= rule.max_skips), news=record.news | spike,
        row_count=record.row_count + 1,
    )


def with_skip(record, spike, table):
    """The record with ``table`` kept as the skip of the step of the next row where ``spike``."""
    slot = record.skip_count % SKIP_SLOTS
    record = record.with_row("skip_values", slot, jnp.where(spike, table, record.skip_values[slot]))
    return record._replace(
        skip_steps=record.skip_steps.at[slot].set(
            jnp.where(spike, record.row_count, record.skip_steps[slot])
        ),
        skip_count=record.skip_count + spike.astype(jnp.int32),
    )


def skip_table(model, judged, spikes, gradients, trainable, optimizer_variables, optimizer=None,
               weights=None, inverse_scale=None):
    """``[weights, len(SKIP_COLUMNS)]``: the would-be update's per-weight values (``stateless_apply``).

    Each value's z-score: the gradient norm's against the window of ``spikes``
    (the `SpikeRecord`), the others' against its samples (`spike_samples`).
    ``optimizer`` and ``weights`` (its variables of ``trainable``): a part of a model's own
    step's (default: ``model.optimizer`` and ``model.trainable_variables``, Keras' step's).
    ``inverse_scale``: 1 / the loss scale of ``gradients`` (``None``: not scaled); the
    optimizer applies them as given, the values are of the true loss's.
    """
    optimizer = model.optimizer if optimizer is None else optimizer
    weights = model.trainable_variables if weights is None else weights
    new_trainable, new_optimizer = optimizer.stateless_apply(optimizer_variables, gradients, trainable)
    gradients = spike_samples.unscaled(gradients, inverse_scale)
    scaled = spike_samples.adam_scaled_gradients(optimizer, weights, gradients, new_optimizer)
    norms, sampled = spike_samples.measured_update(gradients, trainable, new_trainable, scaled, would_be=True)
    _, _, _, mean, std = judged
    known = std[2:] > 0
    z = jnp.where(known, (norms - mean[2:]) / jnp.where(known, std[2:], 1.0), jnp.nan)
    z_sampled, samples = spike_samples.z_scores(spikes.samples, spikes.sample_count, sampled)
    return jnp.concatenate([
        norms[:, None], sampled, z[:, None], z_sampled, jnp.full((len(gradients), 1), samples),
    ], axis=1)


def sample_measure(model, optimizer=None, weights=None, inverse_scale=None):
    """``fn(gradients, old, new, new optimizer variables) -> [weights, 3]``: a sample of an applied update.

    ``optimizer``, ``weights`` and ``inverse_scale``: as `skip_table`'s.
    """
    optimizer = model.optimizer if optimizer is None else optimizer
    weights = model.trainable_variables if weights is None else weights

    def measure(gradients, old, new, new_optimizer):
        gradients = spike_samples.unscaled(gradients, inverse_scale)
        scaled = spike_samples.adam_scaled_gradients(optimizer, weights, gradients, new_optimizer)
        return spike_samples.measured_update(gradients, old, new, scaled)[1]

    return measure


def table_if_new_spike(model, judged, spikes, gradients, trainable, optimizer_variables, optimizer=None,
                       weights=None, inverse_scale=None):
    """`skip_table` where the step spiked and the streak had not stopped training, else zeros.

    Call it inside the branch of a skipped update (the same ``lax.cond`` as the
    update): there the weights' buffers are not needed by anything after the
    update, which then writes them in place. Computed there whenever that
    branch runs (a skipped or non-finite step) and selected: a ``lax.cond``
    nested in the branch cost every clean step (the benchmark transformer's
    guarded step 1.17 of the guard's against 1.01, the MLP's 1.075 against
    1.04; computed before the update's ``lax.cond`` instead, XLA copied the
    MLP's weights and moments every step: 1.21).
    """
    spike = judged[1] & jnp.logical_not(spikes.tripped)
    table = skip_table(model, judged, spikes, gradients, trainable, optimizer_variables, optimizer, weights,
                       inverse_scale)
    return jnp.where(spike, table, 0.0)


def update_unless_skipped(apply, stateless_apply, optimizer_variables, grads, trainable, compiled,
                          skip_table=None, rows=None, sample=None):
    """``((trainable, optimizer variables), skip table, sample)``: the update where ``apply``, else
    the values given.

    The one branch of a skipped update, for Keras' step's part and each part of
    a model's own step: ``stateless_apply(optimizer_variables, grads,
    trainable)`` in one branch of a ``lax.cond``, and in the other the values
    given and ``skip_table(grads, trainable, optimizer_variables)``
    (`table_if_new_spike`; zeros of ``rows`` weights when ``None``), so that the
    update writes in place. ``sample`` (`sample_measure`, in the step the host
    runs as a sample step only): the update's branch also gives
    ``sample(grads, trainable, *its result)`` (zeros where skipped; ``None``
    without it). Eagerly (``compiled`` false) a ``lax.cond`` would compile the
    update, rounding unlike Keras' eager step: both run, a select chooses.
    """
    operands = (list(grads), list(trainable), list(optimizer_variables))
    rows = len(operands[0]) if rows is None else rows
    width, sample_width = (rows, len(SKIP_COLUMNS)), (rows, len(SAMPLED_VALUES))

    def update(operands):
        gradients, trainable, optimizer_variables = operands
        updated = stateless_apply(optimizer_variables, gradients, trainable)
        measured = None if sample is None else sample(gradients, trainable, *updated)
        return updated, jnp.zeros(width, jnp.float32), measured

    def skipped(operands):
        table = jnp.zeros(width, jnp.float32) if skip_table is None else skip_table(*operands)
        return operands[1:], table, None if sample is None else jnp.zeros(sample_width, jnp.float32)

    if compiled:
        return jax.lax.cond(apply, update, skipped, operands)
    kept, table, _ = skipped(operands)
    updated, _, measured = update(operands)
    return select_leaves(apply, updated, kept), table, measured


@compiled_on_its_own(static_argnames=("rule",))
def record_step(rule, spikes, judged, table, sampled, overflowed, accepted):
    """The record after the decision: ``table`` kept as a skip where the step newly spiked,
    ``sampled`` (or ``None``: not a sample step) as a sample where the update was accepted, its row.
    ``overflowed`` (or ``None``): a loss scaler skipped the update itself (`after_step`)."""
    spike = judged[1] & jnp.logical_not(spikes.tripped)
    record = with_skip(spikes, spike, table)
    if sampled is not None:
        taken = accepted if overflowed is None else accepted & jnp.logical_not(overflowed)
        record = spike_samples.with_sample(record, taken, sampled)
    return after_step(record, rule, judged, accepted, overflowed)


def skip_counts(spikes, per_part):
    """The int vectors holding the device's counts of skipped steps (one per part), or ``None``.

    The vectors themselves, not their entries: an entry taken on the host is an op JAX
    dispatches (tens of µs on every step); `SpikeReads.news` reads the entry once computed.
    """
    if spikes is None:
        return None
    return tuple(part.counts for part in spikes) if per_part else (spikes.counts,)


class SpikeReads:
    """The skips read so far, per record (``None``: Keras' step's; a part's number).

    Example:

    >>> from kgrad.plan.spike_rule import SpikeRule
    >>> record = initial_record(SpikeRule(window=4, row_capacity=8), 1)
    >>> SpikeReads().news(skip_counts(record._replace(skip_count=jnp.int32(1)), per_part=False))
    True
    """

    def __init__(self):
        self._seen = {}

    def news(self, counts):
        """Whether ``counts`` (`skip_counts`) say a skip not read yet (reads computed vectors only)."""
        if counts is None or not all(vector.is_ready() for vector in counts):
            return False
        return sum(int(np.asarray(vector)[SKIP_COUNT]) for vector in counts) > sum(self._seen.values())

    def snapshot(self, key, spikes, weights, adam_reason, sample_every=1):
        """Host side (waits for the step): the `SpikeSnapshot` of the record ``spikes``, noted as read.

        ``sample_every``: `kgrad.plan.spike_rule.sample_every` of the rule.
        """
        spikes = jax.device_get(spikes)
        self._seen[key] = int(spikes.skip_count)
        return SpikeSnapshot(
            rows=spikes.rows, row_count=int(spikes.row_count), skip_values=spikes.skip_values,
            skip_steps=spikes.skip_steps, skip_count=int(spikes.skip_count), tripped=bool(spikes.tripped),
            weights=weights, adam_reason=adam_reason, sample_every=sample_every,
        )
