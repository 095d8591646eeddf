"""Sampled running statistics of the applied update, for the z-scores of a skipped step (TensorFlow).

A skipped step's gradient norm is scored against the spike window, which
keeps every accepted step's gradient norms (the guard sums their squares
every step anyway). Its update ratio, cos(g, w) and ``adam_rms`` need a pass
over every parameter, so they are measured on one step run in ``s`` only,
where its update is applied (`kgrad.plan.spike_rule.sample_every`), and kept in a window of
``S`` samples per weight (`kgrad.plan.spike_rule.sample_slots`): the same
values as a skip's table, of the update actually applied.

A sample step does not apply and undo, as a skip does: in one branch of the
guard's switch the weights are read (and ``adam_rms`` computed from the
gradients and Adam's moments) before the step's own update, which then runs
as on any step, and measured after it; another branch is the update alone.
Without XLA the sample branch is one function call (TensorFlow visits every
op of a branch not taken: see
`kgrad.backends.tensorflow.guard.spikes.SpikeState.record_skip`), so a step
that is not a sample step pays a remainder, a branch and one call op not run.
Two branches around the update (a read before it, a measure after it) cost
more: 1.21 of the guard on the benchmark MLP against 1.09 (no sample taken after the first).
Under XLA with one replica a sample step does apply and undo, in the skip's
measuring branch, before the update (`kgrad.backends.tensorflow.guard.xla_measure`:
this branch made XLA copy the whole state on every step).

Example (graph code, before the update's branches)::

    sample, sampled = samples.sampled_update(steps_run, apply, optimizer, measured)
"""

import tensorflow as tf

from kgrad.backends.common.moment_rules import inner_optimizer, moment_rule
from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.tensorflow.handover.replicas import scatter_nd_update, state_variable
from kgrad.backends.tensorflow.summarize.norms import norms_many
from kgrad.backends.tensorflow.summarize.optimizer_state import adam_rms_per_weight
from kgrad.plan.spike_rule import SAMPLED_VALUES, sample_every, sample_slots


def flat(tensor):
    """``tensor`` as a float32 vector."""
    return tf.reshape(tf.cast(tf.convert_to_tensor(tensor), tf.float32), [-1])


def update_values(measured, old, new, rms):
    """``[weights, len(SAMPLED_VALUES)]``: update ratio, cos(g, w) and ``rms`` of the update old → new.

    Args:
        measured: ``[(gradient, weight)]`` of the checked weight gradients.
        old: Each weight before the update (flat float32), in ``measured``'s order.
        new: Each weight after it.
        rms: ``[weights]`` ``adam_rms`` of the update (NaN without a second moment).
    """
    # Exact at any magnitude (one call, one branch): a spike's gradient is where squares overflow.
    norms = norms_many(list(old) + [a - b for a, b in zip(new, old)] + [flat(g) for g, _ in measured])
    weight_norms, update_norms, grad_norms = tf.split(norms, 3)
    dots = tf.stack([tf.reduce_sum(flat(g) * w) for (g, _), w in zip(measured, old)])
    return tf.stack([update_norms / weight_norms, dots / (grad_norms * weight_norms), rms], axis=1)


def unscaled(measured, inverse_scale):
    """``measured`` (``[(gradient, weight)]``) with float32 gradients of the true loss, or as it is
    where ``inverse_scale`` (1 / the loss scale) is ``None``. Graph code: in the branch that measures."""
    if inverse_scale is None:
        return measured
    inverse_scale = tf.cast(inverse_scale, tf.float32)
    return [(tf.cast(tf.convert_to_tensor(g), tf.float32) * inverse_scale, w) for g, w in measured]


def adam_rms_of_update(optimizer, measured):
    """``[weights]`` adam_rms of the update about to be made (NaN without a second moment).

    ``measured``: ``[(gradient, weight)]`` of the checked weight gradients (of the true loss).
    """
    rule, _ = moment_rule(optimizer)
    if rule is None:
        return tf.fill([len(measured)], float("nan"))
    inner = inner_optimizer(optimizer)
    applied = keras_internals.clip_gradients(
        inner, [tf.cast(tf.convert_to_tensor(g), tf.float32) for g, _ in measured]
    )
    indices = [keras_internals.variable_index(inner, weight) for _, weight in measured]
    # One reduction per weight (the skip's, and every sample step's).
    return adam_rms_per_weight(rule, inner, indices, applied)


def noinline(fn):
    """``fn`` as one function-call op (TensorFlow visits every op of a branch not taken)."""
    return tf.function(fn, autograph=False, experimental_attributes={"_noinline": True})


class SampleWindow:
    """Device variables of the samples of ``weights`` checked weights' `SAMPLED_VALUES`.

    Args:
        rule: The `kgrad.plan.spike_rule.SpikeRule`.
        weights: How many weight gradients the guard checks.
    """

    def __init__(self, rule, weights):
        self.slots, self.every = sample_slots(rule), sample_every(rule)
        self.values = state_variable(
            tf.zeros([self.slots, max(weights, 1), len(SAMPLED_VALUES)]), "kgrad_spike_samples"
        )
        self.count = state_variable(tf.constant(0, tf.int64), "kgrad_spike_sample_count")

    def sampled_update(self, steps_run, apply, optimizer, measured, inline=False, overflowed=None,
                       inverse_scale=None):
        """Graph code: ``(sample, sampled)``: whether this step is sampled, and the branch that samples it.

        ``sampled()`` runs ``apply()`` between a read of the weights (and
        ``adam_rms``) and their measure; the guard runs it instead of
        ``apply()`` where ``sample`` (`kgrad.backends.tensorflow.guard.sentinel`).

        Args:
            steps_run: Steps run before this one (the step is the sample where a multiple of ``every``).
            apply: Runs the step's own update, unchanged.
            optimizer: The update's optimizer (for ``adam_rms``).
            measured: ``[(gradient, weight)]`` of the checked weight gradients.
            inline: Under several replicas (the cross-replica context): no nested function.
            overflowed: Whether the loss scaler skips this update itself (then no sample), or ``None``.
            inverse_scale: 1 / the loss scale of ``measured``'s gradients, or ``None``.
        """
        sample = self.is_sample(steps_run, overflowed)
        weights = [weight for _, weight in measured]

        def snapshot():
            return [tf.identity(weight) for weight in weights], adam_rms_of_update(
                optimizer, unscaled(measured, inverse_scale)
            )

        def measure(before, rms):
            old, new = [flat(old) for old in before], [flat(w) for w in weights]
            self.keep(update_values(unscaled(measured, inverse_scale), old, new, rms))
            return tf.constant(0)

        def sampled():
            before, rms = snapshot()
            with tf.control_dependencies(before + [rms]):
                apply()
            measure(before, rms)
            return tf.constant(0)

        # A branch not taken costs its every op without XLA (one call op here). Under XLA with one
        # replica this branch is not used (`xla_measure`). The update is traced in the plain
        # branch too, as the skip's branch traces it.
        return sample, sampled if inline else noinline(sampled)

    def is_sample(self, steps_run, overflowed=None):
        """Graph code: whether the step after ``steps_run`` steps run is sampled (`sampled_update`)."""
        sample = tf.equal(steps_run % self.every, 0)
        if overflowed is not None:  # no update to measure: the next sample step is s steps on
            sample = tf.logical_and(sample, tf.logical_not(overflowed))
        return sample

    def keep(self, table, taken=None):
        """Graph code: ``table`` (`update_values`) as the next sample, where ``taken`` (``None``: always)."""
        slot = self.count % self.slots
        if taken is not None:  # a select, not a branch (`kgrad.backends.tensorflow.guard.xla_measure`)
            table = tf.where(taken, table, tf.gather(self.values, slot))
        scatter_nd_update(self.values, [[slot]], [table])
        self.count.assign_add(tf.constant(1, tf.int64) if taken is None else tf.cast(taken, tf.int64))

    def z_scores(self, values):
        """Graph code: ``[weights, len(SAMPLED_VALUES)]`` z-scores of a skip's ``values`` against the samples.

        (value − mean) / σ (n − 1) over the finite samples written (at most
        ``slots``); NaN (absent) before 2 of them, where σ is 0, or a value is NaN
        (`kgrad.plan.spike_rule.sampled_z_scores` is the NumPy reference).
        """
        filled = tf.minimum(self.count, self.slots)
        # Slots past `filled` were never written; a sample that is not finite (a zero-initialized
        # bias's first update ratio, adam_rms without a second moment) is left out of its weight's.
        written = (tf.range(self.slots, dtype=tf.int64) < filled)[:, None, None]
        valid = tf.logical_and(written, tf.math.is_finite(self.values))
        count = tf.reduce_sum(tf.cast(valid, tf.float32), 0)
        mean = tf.reduce_sum(tf.where(valid, self.values, 0.0), 0) / tf.maximum(count, 1.0)
        squares = tf.reduce_sum(tf.where(valid, tf.square(self.values - mean), 0.0), 0)
        std = tf.sqrt(squares / tf.maximum(count - 1.0, 1.0))
        known = tf.logical_and(count >= 2, std > 0)
        z = tf.where(known, (values - mean) / tf.where(known, std, 1.0), float("nan"))
        return z, tf.cast(filled, tf.float32)
