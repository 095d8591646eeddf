"""Sampled running statistics of the applied update, for the z-scores of a skipped step (JAX).

The JAX counterpart of `kgrad.backends.tensorflow.guard.spike_samples`: a
skipped step's update ratio, cos(g, w) and ``adam_rms`` are scored against
samples of the update actually applied, one every ``s`` steps run
(`kgrad.plan.spike_rule.sample_every`), ``S`` per weight
(`kgrad.plan.spike_rule.sample_slots`), kept in the `SpikeRecord`'s
``samples``. The host runs every ``s``-th step as a sample step: a second
compiled step whose update's branch
(`kgrad.backends.jax.guard.spikes.update_unless_skipped`) runs the same
``stateless_apply`` once, keeps its result as the update and measures it
from the weights before and after it. A sample branch inside the one step
would cost every step: XLA then copies every weight and Adam moment on every
step, since a branch that reads them after writing them rules out the
in-place update (benchmarks/RESULTS.md).

Example:

>>> import jax.numpy as jnp
>>> samples = jnp.array([[[1.0]], [[3.0]]])
>>> z, count = z_scores(samples, jnp.asarray(2), jnp.array([[4.0]]))
>>> round(float(z[0, 0]), 4), float(count)
(1.4142, 2.0)
"""

import jax.numpy as jnp

from kgrad.backends.common.moment_rules import inner_optimizer
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.summarize.compiled import compiled_on_its_own
from kgrad.backends.jax.summarize.one_pass import norms_in_one_read
from kgrad.backends.jax.summarize.optimizer_state import OptimizerMoments, adam_scaled, rms_from_squares


@compiled_on_its_own(static_argnames=("would_be",))
def measured_update(gradients, old, new, scaled_gradients, would_be=False):
    """``([weights] gradient norms, [weights, 3] update ratio, cos(g, w), adam_rms)`` of ``old`` → ``new``.

    Each weight's totals (its norm, its change's, its gradient's, g · w and
    the squares of ``adam_rms``'s tensor) are one reduction over every axis
    where the weight lies: the would-be update is computed as it is read,
    nothing the size of a weight is written (`docs/sharded.md`), and under
    ``ModelParallel`` each device sums its part, then an all-reduce of the
    totals (no ``ravel``, which gathers a split weight). The norms cannot
    overflow (`kgrad.backends.jax.summarize.one_pass.norms_in_one_read`: a
    plain sum of squares, and Blue's norms where one is not finite or too
    small): a spiking step's gradient is where a plain sum would overflow.

    Args:
        gradients: The update's gradients, one per weight.
        old: Each weight before the update; ``new``: after it.
        scaled_gradients: `adam_scaled_gradients`: each weight's tensor whose RMS is ``adam_rms``, or
            ``None`` (then NaN: no second moment).
        would_be: ``new`` is a would-be update, computed as it is read in a skipped step's branch
            (Blue's norms only: `norms_in_one_read`'s ``blue_only``).
    """
    groups = [_weight_and_update(*arguments) for arguments in zip(gradients, old, new, scaled_gradients)]
    gradient_norms, rows = [], []
    for ((weight_norm, update_norm, gradient_norm), totals), scaled in zip(
        norms_in_one_read(groups, blue_only=would_be), scaled_gradients
    ):
        rms = jnp.float32(jnp.nan) if scaled is None else rms_from_squares(totals[1], scaled.shape)
        gradient_norms.append(gradient_norm)
        rows.append(jnp.stack([update_norm / weight_norm, totals[0] / (gradient_norm * weight_norm), rms]))
    return jnp.stack(gradient_norms), jnp.stack(rows).reshape(len(rows), 3)


def _weight_and_update(gradient, before, after, scaled):
    """A `norms_in_one_read` group: a weight, its update and its gradient, with g · w and ``scaled``²."""

    def read():
        weight, gradient_32 = before.astype(jnp.float32), gradient.astype(jnp.float32)
        rms_part = () if scaled is None else ((jnp.square(scaled), 0.0, jnp.add),)
        return ([weight, after.astype(jnp.float32) - weight, gradient_32],
                [(gradient_32 * weight, 0.0, jnp.add), *rms_part])

    return read


def with_sample(record, taken, sampled):
    """The record with ``sampled`` (``[weights, 3]``) kept as its next sample where ``taken``."""
    slot = record.sample_count % record.samples.shape[0]
    record = record.with_row("samples", slot, jnp.where(taken, sampled, record.samples[slot]))
    return record._replace(
        sample_count=record.sample_count + taken.astype(jnp.int32),
    )


@compiled_on_its_own
def z_scores(samples, sample_count, values):
    """``([weights, 3] z-scores of a skip's ``values`` against ``samples``, samples used)``.

    (value − mean) / σ (n − 1) over the finite samples written (at most ``S``);
    NaN (absent) before 2 of them, where σ is 0, or a value is NaN
    (`kgrad.plan.spike_rule.sampled_z_scores` is the NumPy reference).
    """
    slots = samples.shape[0]
    filled = jnp.minimum(sample_count, slots)
    # Slots past `filled` were never written; a sample that is not finite (a zero-initialized bias's
    # first update ratio, adam_rms without a second moment) is left out of its weight's statistics.
    valid = (jnp.arange(slots) < filled)[:, None, None] & jnp.isfinite(samples)
    count = jnp.sum(valid, 0).astype(jnp.float32)
    mean = jnp.sum(jnp.where(valid, samples, 0.0), 0) / jnp.maximum(count, 1.0)
    variance = jnp.sum(jnp.where(valid, jnp.square(samples - mean), 0.0), 0) / jnp.maximum(count - 1.0, 1.0)
    std = jnp.sqrt(variance)
    known = (count >= 2) & (std > 0)
    return jnp.where(known, (values - mean) / jnp.where(known, std, 1.0), jnp.nan), filled.astype(jnp.float32)


def unscaled(gradients, inverse_scale):
    """``gradients`` of the true loss (float32, the loss scale divided out), or as given without one."""
    if inverse_scale is None:
        return gradients
    return [jnp.asarray(g, jnp.float32) * inverse_scale for g in gradients]


def adam_scaled_gradients(optimizer, weights, gradients, state_after):
    """Per weight, the tensor whose RMS is its ``adam_rms`` after the would-be update, or ``None``.

    ``None`` for every weight of an optimizer without a second moment, and
    for a weight the optimizer does not update: its ``adam_rms`` is NaN.
    """
    moments = OptimizerMoments(optimizer, weights)
    if moments.rule is None:
        return [None] * len(weights)
    inner = inner_optimizer(optimizer)
    applied = keras_internals.clip_gradients(inner, [jnp.asarray(g, jnp.float32) for g in gradients])
    step = moments.step_after(state_after)
    hyper = [jnp.float32(getattr(inner, name)) for name in ("beta_1", "beta_2", "epsilon")]
    scaled = []
    for number in range(len(weights)):
        kept = moments.moments_after(number, state_after)  # (m, v, AMSGrad's max) or None
        scaled.append(None if kept is None else adam_scaled(moments.rule, applied[number], *kept[1:], step,
                                                             hyper))
    return scaled
