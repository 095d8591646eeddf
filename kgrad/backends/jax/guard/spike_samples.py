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
from kgrad.backends.jax.summarize.optimizer_state import OptimizerMoments, moment_statistics


def norm(tensor):
    """The L2 norm of ``tensor``, in float32, reduced over every axis where it lies.

    No ``ravel``: reshaping a weight split over devices (`ModelParallel`) gathers it whole
    onto every device; a reduction over all its axes sums each device's part, then the parts.
    """
    return jnp.sqrt(jnp.sum(jnp.square(tensor.astype(jnp.float32))))


def dot(a, b):
    """The sum of ``a * b`` in float32, over every axis (no ``ravel``, as `norm`)."""
    return jnp.sum(a.astype(jnp.float32) * b.astype(jnp.float32))


def update_values(gradients, old, new, rms):
    """``[weights, 3]``: update ratio, cos(g, w) and ``rms`` of the update ``old`` → ``new``.

    Args:
        gradients: The update's gradients, one per weight.
        old: Each weight before the update; ``new``: after it.
        rms: ``[weights]`` ``adam_rms`` of the update (NaN without a second moment).
    """
    weight_norms = jnp.stack([norm(w) for w in old])
    update_norms = jnp.stack([norm(a.astype(jnp.float32) - b.astype(jnp.float32)) for a, b in zip(new, old)])
    dots = jnp.stack([dot(g, w) for g, w in zip(gradients, old)])
    grad_norms = jnp.stack([norm(g) for g in gradients])
    return jnp.stack([update_norms / weight_norms, dots / (grad_norms * weight_norms), rms], axis=1)


def with_sample(record, taken, sampled):
    """The record with ``sampled`` (``[weights, 3]``) kept as its next sample where ``taken``."""
    slot = record.sample_count % record.samples.shape[0]
    record = record.with_row("samples", slot, jnp.where(taken, sampled, record.samples[slot]))
    return record._replace(
        sample_count=record.sample_count + taken.astype(jnp.int32),
    )


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


def adam_rms(optimizer, weights, gradients, state_after):
    """``[weights]`` adam_rms from the optimizer's state after the would-be update (NaN without one)."""
    moments = OptimizerMoments(optimizer, weights)
    if moments.rule is None:
        return jnp.full((len(weights),), jnp.nan, jnp.float32)
    inner = inner_optimizer(optimizer)
    applied = keras_internals.clip_gradients(inner, [jnp.asarray(g, jnp.float32) for g in gradients])
    step = moments.step_after(state_after)
    hyper = [jnp.float32(getattr(inner, name)) for name in ("beta_1", "beta_2", "epsilon")]
    rms = []
    for number in range(len(weights)):
        kept = moments.moments_after(number, state_after)
        if kept is None:  # the optimizer does not update this weight
            rms.append(jnp.float32(jnp.nan))
            continue
        rms.append(moment_statistics(moments.rule, applied[number], *kept, step, hyper, 6.0)[0])
    return jnp.stack(rms)
