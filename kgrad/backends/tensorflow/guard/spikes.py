"""The spike rule inside TensorFlow's guarded step: its device variables and their graph code.

`SpikeState` judges every step (`kgrad.plan.spike_rule`, the NumPy reference):
the logarithms of the step's loss and global gradient norm against mean + kσ
of the last N accepted steps, a window kept in a device variable (its mean and
σ: `window_statistics`). Its `GuardState`
(`kgrad.backends.tensorflow.guard.sentinel`) then skips the update of a
spiking step exactly as it skips a non-finite one. Every step also writes one
row of per-step values (skipped, score, the window's mean and σ) into a device
buffer that the host reads only when a skip has happened, at an epoch's end,
or when the buffer is full. In the branch of a skipped step only (under XLA:
`kgrad.backends.tensorflow.guard.xla_measure`), the update the step would
have made is applied, measured and undone (`SpikeState.record_skip`): the
per-weight values of the skip, and their z-scores against the weight's window
of gradient norms and its samples of the applied update (`spike_samples`).
"""

import numpy as np
import tensorflow as tf

from kgrad.backends.common.moment_rules import moment_rule
from kgrad.backends.tensorflow.guard.spike_samples import (
    SampleWindow, adam_rms_of_update, flat, unscaled, update_values,
)
from kgrad.backends.tensorflow.guard.spike_window import beyond_squares, window_statistics
from kgrad.backends.tensorflow.handover.replicas import scatter_nd_update, state_variable
from kgrad.backends.tensorflow.summarize.norms import norms_many
from kgrad.plan.spike_rule import MIN_LOG_SIGMA, ROW_COLUMNS, SKIP_COLUMNS, SKIP_SLOTS, SpikeSnapshot

_TINY = float(np.finfo(np.float32).tiny)  # float32's smallest normal: the logarithm of a 0 norm is finite


class SpikeState:
    """Device variables of the spike rule for ``weights`` checked gradients.

    Args:
        rule: The `kgrad.plan.spike_rule.SpikeRule`.
        weights: How many weight gradients the guard checks.
    """

    def __init__(self, rule, weights):
        self.rule, self.weights = rule, weights
        self.optimizer = None  # the optimizer of the judged update (set when the step is traced)
        columns = 2 + weights  # loss, global norm, each weight's norm
        self.window = state_variable(tf.zeros([rule.window, columns]), "kgrad_spike_window")
        self.accepted = state_variable(tf.constant(0, tf.int64), "kgrad_spike_accepted")
        self.streak = state_variable(tf.constant(0, tf.int64), "kgrad_spike_streak")
        self.tripped = state_variable(False, "kgrad_spike_tripped")
        self.news = state_variable(False, "kgrad_spike_news")  # a skip the host has not read
        self.rows = state_variable(tf.zeros([rule.row_capacity, len(ROW_COLUMNS)]), "kgrad_spike_rows")
        self.row_count = state_variable(tf.constant(0, tf.int64), "kgrad_spike_row_count")
        self.skip_values = state_variable(
            tf.zeros([SKIP_SLOTS, max(weights, 1), len(SKIP_COLUMNS)]), "kgrad_spike_skip_values"
        )
        self.skip_steps = state_variable(tf.fill([SKIP_SLOTS], tf.constant(-1, tf.int64)), "kgrad_skip_steps")
        self.skip_count = state_variable(tf.constant(0, tf.int64), "kgrad_spike_skip_count")
        self.samples = SampleWindow(rule, weights)

    def applied_update(self, step, apply, optimizer, measured, inline=False, overflowed=None,
                       inverse_scale=None):
        """Graph code: ``(sample, sampled)``: whether to sample the update, and its branch (`SampleWindow`).

        ``step``: the step's row (`decide`'s ``before``), steps run as on JAX; the rest as `SampleWindow`'s.
        """
        return self.samples.sampled_update(step, apply, optimizer, measured, inline, overflowed,
                                           inverse_scale)

    def decide(self, loss, weight_squares, may_apply, halt_updates, overflowed=None):
        """Graph code: ``(apply, judged, before)``: the step's decision, the rule's state already written.

        `judge` and the decision sit before the update's branch; `after_step` runs beside it.

        Args:
            loss, weight_squares: As `judge`'s.
            may_apply: Whether the guard's check lets the update run.
            halt_updates: A trip of the rule (``max_skips``) stops later updates too.
            overflowed: A loss scaler's gradients overflowed (`after_step`), or ``None``.

        Returns:
            ``apply``: the update runs (``may_apply`` and no spike); ``judged``:
            what `judge` returned; ``before``: `accepted`, `row_count` and `tripped`
            before the step (its row, whether a sample step, whether its skip is kept).
        """
        before = (self.accepted.read_value(), self.row_count.read_value(), self.tripped.read_value())
        # Every gradient element finite (the guard's exact counts), no loss scaler's overflow.
        finite = may_apply if overflowed is None else tf.logical_and(may_apply, tf.logical_not(overflowed))
        judged = self.judge(tf.cast(loss, tf.float32), weight_squares, finite)
        apply = tf.logical_and(may_apply, tf.logical_not(judged[1]))
        if halt_updates:
            apply = tf.logical_and(apply, tf.logical_not(before[2]))
        self.after_step(*judged, accepted=apply, overflowed=overflowed)
        return apply, judged, before

    def judge(self, loss, weight_squares, gradients_finite=None):
        """Graph code: ``(values, spike, score, mean, std)`` of this step.

        ``values`` are the window's row of the step: the logarithms of the loss
        and of the global norm, then each weight's gradient norm as it is (the
        skip's per-weight z-scores rank weights, they decide nothing);
        ``mean`` and ``std`` the window's, per column (NaN before two accepted
        steps, or where the window holds a loss that is not positive), computed
        here from the window (kept in a variable, computed after each step for
        the next, they measured no cheaper: benchmarks/RESULTS.md).

        Args:
            loss: The step's loss (unscaled, a scalar).
            weight_squares: ``[weights]`` each weight gradient's sum of squares (unscaled).
            gradients_finite: Whether every element of those gradients is finite (``None``:
                unknown). Where it is, a global norm beyond float32's sum of squares
                (above ~1.8e19) spikes, in the warm-up too, with a score of +Inf: its
                logarithm cannot be taken from the sums, and no step that size is a window's.
        """
        mean, std = window_statistics(self.window, self.accepted, self.rule.window)
        raw = tf.stack([tf.cast(loss, tf.float32), tf.sqrt(tf.reduce_sum(weight_squares))])
        # ln of each (float32's smallest for a 0 norm); NaN for a loss that is not positive.
        logs = tf.math.log(tf.maximum(raw, _TINY))
        logs = tf.stack([tf.where(raw[0] > 0, logs[0], float("nan")), logs[1]])
        z = (logs - mean[:2]) / tf.maximum(std[:2], MIN_LOG_SIGMA)
        # `filled >= warmup`, as warmup <= the window's length.
        judged = tf.logical_and(self.accepted >= self.rule.warmup, tf.math.is_finite(z))
        score = tf.reduce_max(tf.where(judged, z, float("-inf")))
        # The per-weight norms are finite wherever the global norm is (a sum of their squares).
        finite = tf.reduce_all(tf.math.is_finite(raw))
        spike = tf.logical_and(finite, score > self.rule.sigmas)
        score = tf.where(tf.reduce_any(judged), score, float("nan"))
        if gradients_finite is not None:
            beyond = beyond_squares(raw, gradients_finite)
            spike, score = tf.logical_or(spike, beyond), tf.where(beyond, float("inf"), score)
        values = tf.concat([logs, tf.sqrt(weight_squares)], 0)
        return values, spike, score, mean, std

    def after_step(self, values, spike, score, mean, std, accepted, overflowed=None):
        """Graph code after the decision: the window, the streak, the trip and the step's row.

        Steps are numbered by the rows: every step run since the fit began,
        skipped ones too (``optimizer.iterations`` does not count a skipped step).

        No branch: a clean step writes one window row (unchanged unless
        ``accepted``), the streak and one row of per-step values. A step whose gradients ``overflowed``
        (a loss scaler's: `overflow`) is out of the window and the streak.
        """
        row_accepted = accepted  # the row's `skipped`: whether the guard let the update run
        if overflowed is not None:
            accepted = tf.logical_and(accepted, tf.logical_not(overflowed))
        slot = self.accepted % self.rule.window
        old = tf.gather(self.window, slot)  # a slice at a traced index would recompile under XLA
        scatter_nd_update(self.window, [[slot]], [tf.where(accepted, values, old)])
        self.accepted.assign_add(tf.cast(accepted, tf.int64))
        streak = tf.where(spike, self.streak + 1, tf.where(accepted, tf.constant(0, tf.int64), self.streak))
        self.streak.assign(streak)
        self.tripped.assign(tf.logical_or(self.tripped, streak >= self.rule.max_skips))
        self.news.assign(tf.logical_or(self.news, spike))
        row = tf.stack([
            tf.cast(self.row_count, tf.float32), 1.0 - tf.cast(row_accepted, tf.float32), score,
            mean[0], std[0], mean[1], std[1],
        ])
        scatter_nd_update(self.rows, [[self.row_count % self.rule.row_capacity]], [row])
        self.row_count.assign_add(1)

    def record_skip(self, kept, judged, row, optimizer, applied, measured, apply_update=None,
                    inverse_scale=None):
        """Graph code, in the branch of a skipped step: `measure_skip` where ``kept``, in a call of its own.

        ``kept``: the step spiked, and the rule had not tripped before it.
        Under several replicas (``apply_update`` given, the cross-replica
        context), inline: the update's all-reduce cannot sit in a nested function.

        Not inlined: TensorFlow's graph executor visits every op of a branch
        not taken (its dead tensors propagate), and the would-be update is
        hundreds of ops on a large model; one call op is one visit. The
        ``tf.cond`` of ``kept`` is inside the call: in the branch it added a
        Switch per captured tensor, 56 visits a step on the benchmark MLP
        (benchmarks/RESULTS.md).
        """
        def measure(apply_update=None):
            self.measure_skip(judged, row, optimizer, applied, measured, apply_update, inverse_scale)
            return tf.no_op()

        if apply_update is not None:
            tf.cond(kept, lambda: measure(apply_update), tf.no_op)
            return

        @tf.function(autograph=False, experimental_attributes={"_noinline": True})
        def call():
            tf.cond(kept, measure, tf.no_op)
            return tf.constant(0)

        call()

    def measure_skip(self, judged, row, optimizer, applied, measured, apply_update=None, inverse_scale=None):
        """Graph code, in the branch of a skipped step: its per-weight values, kept for the host.

        ``judged``: what `judge` returned; ``row``: the step's row (`decide`'s
        ``before``); the rest as `would_be_update`'s, which measures the update
        the step would have made, as if the branch had not run.
        """
        measured, sampled = self.would_be_update(optimizer, applied, measured, apply_update, inverse_scale)
        self.keep_skip(self.skip_table(judged, measured, sampled), row)

    def would_be_update(self, optimizer, applied, measured, apply_update=None, inverse_scale=None):
        """Graph code: ``(measured unscaled, [weights, len(SAMPLED_VALUES)])``: the update ``applied`` makes.

        The update is applied, measured and undone: every weight and
        optimizer variable is assigned back the value it had (bit for bit).

        Args:
            optimizer: ``model.optimizer``.
            applied: ``[(gradient, weight)]``: the whole update, as the step applies it.
            measured: ``[(gradient, weight)]`` of the checked weight gradients, in their rows' order.
            apply_update: What applies ``applied`` (``None``: ``optimizer.apply_gradients``);
                under several replicas, on every replica (`kgrad.backends.tensorflow.guard.replicated`).
            inverse_scale: 1 / the loss scale of ``measured`` (``None``: not scaled), measured unscaled.
        """
        measured = unscaled(measured, inverse_scale)
        weights = [weight for _, weight in applied]
        before = [tf.identity(weight) for weight in weights]
        state = [tf.identity(variable) for variable in optimizer.variables]
        rms = adam_rms_of_update(optimizer, measured)
        with tf.control_dependencies(before + state + [rms]):
            if apply_update is None:
                optimizer.apply_gradients(applied)
            else:
                apply_update()
        position = {id(weight): index for index, weight in enumerate(weights)}
        after = [tf.identity(weight) for weight in weights]
        with tf.control_dependencies(after):
            for variable, value in zip(weights + list(optimizer.variables), before + state):
                variable.assign(value)
        old = [flat(before[position[id(w)]]) for _, w in measured]
        new = [flat(after[position[id(w)]]) for _, w in measured]
        return measured, update_values(measured, old, new, rms)

    def skip_table(self, judged, measured, sampled):
        """Graph code: a skip's ``[weights, len(SKIP_COLUMNS)]`` table from `would_be_update`'s values."""
        mean, std = judged[3:]
        grad_norms = norms_many([flat(g) for g, _ in measured])  # exact where a spike's squares overflow
        # Against the weight's own column of the window: NaN (absent) where σ is 0 or unknown.
        known = std[2:] > 0
        z = tf.where(known, (grad_norms - mean[2:]) / tf.where(known, std[2:], 1.0), float("nan"))
        z_sampled, samples = self.samples.z_scores(sampled)
        return tf.concat([
            grad_norms[:, None], sampled, z[:, None], z_sampled, tf.fill([len(measured), 1], samples),
        ], axis=1)

    def keep_skip(self, table, row, kept=None):
        """Graph code: ``table`` and the step's ``row`` kept as the next skip where ``kept`` (or always)."""
        slot = self.skip_count % SKIP_SLOTS
        if kept is not None:  # a select, not a branch (`kgrad.backends.tensorflow.guard.xla_measure`)
            table = tf.where(kept, table, tf.gather(self.skip_values, slot))
            row = tf.where(kept, row, tf.gather(self.skip_steps, slot))
        scatter_nd_update(self.skip_values, [[slot]], [table])
        scatter_nd_update(self.skip_steps, [[slot]], [row])
        self.skip_count.assign_add(tf.constant(1, tf.int64) if kept is None else tf.cast(kept, tf.int64))

    def read(self, weights, optimizer):
        """Host side (a device read: on a skip, at an epoch's end): the `SpikeSnapshot`; clears the news.

        Args:
            weights: The weight paths of the tables' rows.
            optimizer: ``model.optimizer`` (for why ``adam_rms`` may be absent), unless the
                judged update's own optimizer is known (a model's own ``train_step``).
        """
        snapshot = SpikeSnapshot(
            rows=self.rows.numpy(), row_count=int(self.row_count.numpy()),
            skip_values=self.skip_values.numpy(), skip_steps=self.skip_steps.numpy(),
            skip_count=int(self.skip_count.numpy()), tripped=bool(self.tripped.numpy()),
            weights=tuple(weights), adam_reason=moment_rule(self.optimizer or optimizer)[1],
            sample_every=self.samples.every,
        )
        self.news.assign(False)
        return snapshot

    def reset(self, everything=False):
        """Re-arms after a stop report; with ``everything``, forgets the window and the buffers."""
        self.tripped.assign(False)
        self.streak.assign(0)
        if everything:
            self.accepted.assign(0)
            self.news.assign(False)
            self.row_count.assign(0)
            self.skip_count.assign(0)
            self.samples.count.assign(0)
