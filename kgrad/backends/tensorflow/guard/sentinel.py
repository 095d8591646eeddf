"""The guard's device variables and the graph code of its every-step check and guarded update."""

import tensorflow as tf

from kgrad.backends.tensorflow.guard import overflow, replicated
from kgrad.backends.tensorflow.guard.spikes import SpikeState
from kgrad.backends.tensorflow.guard.xla_measure import measure_before_update
from kgrad.backends.tensorflow.handover import replicas
from kgrad.backends.tensorflow.summarize import stats
from kgrad.backends.tensorflow.summarize.log_buckets import in_xla
from kgrad.report.non_finite import report_of_counts, split_name
from kgrad.backends.tensorflow.handover.replicas import state_variable


#: Kinds of checked tensors that loss scaling multiplies (see `GuardState.guarded_apply`).
SCALED_KINDS = frozenset({"loss", "weight_grad", "grad", "input_grad"})


class GuardState:
    """Device variables of the guard, and the graph code that fills them.

    Args:
        names: Tensor names (``"<kind>/<layer>"``) in check order.
        on_trip_only: Names of the tensors that are computed and checked on a
            tripped step only (see `watched_tensors`).
        spikes: The `kgrad.plan.spike_rule.SpikeRule` of a guard that skips
            spikes (its `SpikeState` is ``self.spikes``), or ``None``.
        scaler_owned: Names whose overflow a ``LossScaleOptimizer`` skips itself (`overflow`).
    """

    def __init__(self, names, on_trip_only=(), spikes=None, scaler_owned=()):
        self.names = tuple(names)
        self.on_trip_only = frozenset(on_trip_only)
        self.scaler_owned = frozenset(scaler_owned)
        count = len(self.names)
        self.tripped = state_variable(False, "kgrad_guard_tripped")
        self.trip_step = state_variable(tf.constant(-1, tf.int64), "kgrad_guard_step")
        self.counts = state_variable(tf.zeros([count, 2]), "kgrad_guard_counts")
        self.last_finite_step = state_variable(tf.constant(-1, tf.int64), "kgrad_guard_last_step")
        self.last_finite_half_squares = state_variable(tf.zeros([count]), "kgrad_guard_last_squares")
        self._weight_rows = [i for i, name in enumerate(self.names) if split_name(name)[0] == "weight_grad"]
        self.spikes = None if spikes is None else SpikeState(spikes, len(self._weight_rows))

    def flag(self):
        """Graph code: what the host reads after each execution: a trip, or a skip it has not seen.

        A float 0 or 1 under several replicas: Keras averages a step's outputs over them
        (each holds the same).
        """
        flag = self.tripped.read_value() if self.spikes is None else tf.reduce_any(
            tf.stack([self.tripped, self.spikes.news, self.spikes.tripped])
        )
        return tf.cast(flag, tf.float32) if replicas.multi_replica() else flag

    def guarded_apply(self, tensors, step, apply, halt_updates, inverse_scale=None, on_trip=None,
                      on_skip=None, spike_update=None):
        """Checks ``tensors`` (in ``names`` order) and runs ``apply()`` if it may.

        Graph code: runs inside the train step, every step. A clean step costs
        one sum of squares per tensor, two branches (the check and the
        update) and two small selects (the record of the last finite step).
        ``on_trip`` (a zero-argument callable, or ``None``) runs in the branch
        of the step that trips the guard only: the step's batch is kept there
        (`TrippedBatch.keep`), at no cost to a clean step.
        ``on_skip`` (a zero-argument callable, or ``None``) runs in the branch
        of every step whose ``apply`` does not run: the state the forward
        pass wrote is put back there (`kgrad.backends.tensorflow.differentiate.forward_state`).
        ``apply`` runs when every tensor is finite and, with
        ``halt_updates``, no earlier step of the execution tripped; it also
        runs on a step whose sums overflowed but whose exact counts find no
        NaN or Inf. The tensors of ``on_trip_only`` names are zero-argument
        callables, called only when another tensor of the step is non-finite.

        ``inverse_scale`` (a scalar tensor, or ``None``): 1 / the loss scale
        the step's loss was multiplied by (mixed precision); the norms kept
        for the report are then those of the true loss and its gradients.

        With ``self.spikes``, a finite step that spikes (`SpikeState.judge`)
        is skipped the same way; ``spike_update`` is ``(optimizer, weights,
        gradients)`` of the checked weight gradients, measured in the
        branch of a spiking step only (`SpikeState.record_skip`).

        Returns:
            A boolean tensor: whether ``apply`` ran.
        """
        if replicas.multi_replica():  # the decision and the update in the cross-replica context
            return replicated.guarded_apply(
                self, tensors, step, apply, halt_updates, inverse_scale, on_skip, spike_update
            )
        every_step = [t for name, t in zip(self.names, tensors) if name not in self.on_trip_only]
        # Half sums of squares (`tf.nn.l2_loss`, one kernel each): non-finite
        # whenever an element is; the host doubles them for the norms.
        half_squares = tf.stack([tf.nn.l2_loss(tf.cast(t, tf.float32)) for t in every_step])

        def counts():
            computed = [t() if name in self.on_trip_only else t for name, t in zip(self.names, tensors)]
            return tf.stack([stats.count_nonfinite(t) for t in computed])

        return self.decide(
            half_squares, counts, tensors[self.names.index("loss/loss")], step, apply, halt_updates,
            inverse_scale, on_trip, on_skip, spike_update,
        )

    def decide(self, half_squares, counts, loss, step, apply, halt_updates, inverse_scale=None,
               on_trip=None, on_skip=None, spike_update=None):
        """`guarded_apply` from the step's checks: ``half_squares`` of the every-step tensors, ``counts()``.

        ``counts()`` gives every tensor's ``[NaN, Inf]`` counts, called in the
        branch of a step whose sums are not finite; ``loss`` is the step's loss.
        Under several replicas, graph code of the cross-replica context
        (`kgrad.backends.tensorflow.guard.replicated`): all of these are then
        the global batch's, and ``apply``, ``on_skip`` run on every replica.
        """
        unscale = self._unscale_half_squares(inverse_scale)
        every_step = [name for name in self.names if name not in self.on_trip_only]
        finite, overflowed = overflow.finite_and_overflowed(half_squares, every_step, self.scaler_owned)
        clean = tf.reduce_all(finite)
        if halt_updates:
            clean = tf.logical_and(clean, tf.logical_not(self.tripped))

        def locate():
            found = overflow.without_owned(counts(), self.names, self.scaler_owned)
            really_bad = tf.reduce_any(found > 0)

            def record_trip():
                self.counts.assign(found)
                self.trip_step.assign(tf.cast(step, tf.int64))
                self.tripped.assign(True)
                if on_trip is not None:
                    on_trip()
                return tf.constant(False)

            first_trip = tf.logical_and(really_bad, tf.logical_not(self.tripped))
            # No NaN or Inf, only squares that overflowed: a clean step,
            # whose update is applied.
            return tf.cond(
                first_trip, record_trip, lambda: tf.logical_not(really_bad)
            )

        def not_clean():
            if not halt_updates:
                return locate()
            # After a trip the rest of the execution updates nothing, checks
            # nothing and keeps the last finite step from before the trip.
            return tf.cond(self.tripped, lambda: tf.constant(False), locate)

        # A clean step's branch holds nothing: the record of a finite step
        # is two small selects after it, not writes inside a branch that
        # runs every step (see benchmarks/RESULTS.md, "The guard's branches").
        may_apply = tf.cond(clean, lambda: tf.constant(True), not_clean)
        if self.spikes is not None:
            self.spikes.optimizer = spike_update[0]  # the part's own, for what the host says of Adam
            may_apply, judged, before = self._decide_spike(
                loss, unscale(half_squares), inverse_scale, may_apply, halt_updates, overflowed
            )
            spike = judged[1]
        # Every applied step is a finite one (an overflowed sum is kept as
        # Inf, which the host reports as unknown).
        self.last_finite_half_squares.assign(
            tf.where(may_apply, self._spread(unscale(half_squares)), self.last_finite_half_squares)
        )
        self.last_finite_step.assign(
            tf.where(may_apply, tf.cast(step, tf.int64), self.last_finite_step)
        )

        def update():
            apply()
            return tf.no_op()

        # Under XLA, one replica: the measures ordered before the update (`xla_measure`).
        ordered_measure = self.spikes is not None and in_xla() and len(spike_update) == 3
        kept = None if self.spikes is None else tf.logical_and(spike, tf.logical_not(before[2]))

        def skipped():
            if on_skip is not None:
                on_skip()
            if self.spikes is not None and not ordered_measure:  # where it spiked, before a trip
                self.spikes.record_skip(kept, judged, before[1], *spike_update, inverse_scale=inverse_scale)
            return tf.no_op()

        # A branch of its own: the update is traced once (a large model's
        # update is a good part of its step's graph; tracing it into two
        # branches cost the MobileNet ~170 MB of peak memory).
        if self.spikes is None:
            tf.cond(may_apply, update, skipped)
        elif ordered_measure:
            sample = tf.logical_and(may_apply, self.spikes.samples.is_sample(before[1], overflowed))
            ordered = measure_before_update(
                self.spikes, kept, sample, judged, before[1], *spike_update, inverse_scale=inverse_scale
            )
            tf.cond(tf.logical_and(may_apply, ordered), update, skipped)
        else:  # the update, sampled every few steps run (for a later skip's z-scores), or the skip
            optimizer, _, measured = spike_update[:3]
            # Under several replicas (an update of every replica given): the cross-replica context.
            sample, sampled = self.spikes.applied_update(
                before[1], apply, optimizer, measured, len(spike_update) > 3, overflowed, inverse_scale
            )

            def sampled_update():
                sampled()
                return tf.no_op()

            # One switch of three: a `tf.cond` of the sample nested in the update's branch
            # put a Switch per captured tensor on every step (benchmarks/RESULTS.md).
            tf.switch_case(tf.where(may_apply, tf.where(sample, 1, 0), 2), [update, sampled_update, skipped])
        self.applied = may_apply  # the step's decision, for the metrics (`metrics_before_step`)
        return may_apply

    def _decide_spike(self, loss, every_step_half_squares, inverse_scale, may_apply, halt_updates,
                      overflowed=None):
        """`SpikeState.decide` of the step, from the loss and the weight gradients' sums of squares."""
        squares = 2.0 * self._spread(every_step_half_squares)
        loss = tf.cast(loss, tf.float32)
        if inverse_scale is not None:
            loss = loss * tf.cast(inverse_scale, tf.float32)
        weight_squares = tf.gather(squares, self._weight_rows)
        return self.spikes.decide(loss, weight_squares, may_apply, halt_updates, overflowed)

    def _unscale_half_squares(self, inverse_scale):
        """``fn(half squares of the every-step tensors) -> those of the unscaled loss's tensors``."""
        if inverse_scale is None:
            return lambda half_squares: half_squares
        # The loss and the gradients were multiplied by the scale; inputs,
        # activations and dJ/dŷ (of the compiled loss) were not.
        scaled = [
            split_name(name)[0] in SCALED_KINDS for name in self.names if name not in self.on_trip_only
        ]
        factors = tf.where(tf.constant(scaled), tf.square(tf.cast(inverse_scale, tf.float32)), 1.0)
        return lambda half_squares: half_squares * factors

    def _spread(self, every_step_values):
        """Values of the every-step tensors, at their places among ``names`` (0 elsewhere)."""
        if not self.on_trip_only:
            return every_step_values
        positions = [[i] for i, name in enumerate(self.names) if name not in self.on_trip_only]
        return tf.scatter_nd(positions, every_step_values, [len(self.names)])

    def read_spikes(self, optimizer):
        """Host side: the spike rule's `kgrad.plan.spike_rule.SpikeSnapshot`, or ``None`` without it."""
        if self.spikes is None:
            return None
        weights = [split_name(self.names[row])[1] for row in self._weight_rows]
        return self.spikes.read(weights, optimizer)

    def read_report(self, last_summaries_for):
        """Host side: the `NonFiniteReport` of a tripped guard, or ``None``.

        Args:
            last_summaries_for: ``fn(layer, last_finite_step) -> dict``, the
                summaries of that layer from the latest finite probed step.
        """
        if not bool(self.tripped.numpy()):
            return None
        half_squares = self.last_finite_half_squares.numpy()

        def last_finite_squares(name):
            if name in self.on_trip_only:
                return None  # checked only on a tripped step
            return 2.0 * float(half_squares[self.names.index(name)])

        return report_of_counts(
            dict(zip(self.names, self.counts.numpy())),
            step=int(self.trip_step.numpy()),
            last_finite_step=int(self.last_finite_step.numpy()),
            last_finite_squares=last_finite_squares,
            last_summaries_for=last_summaries_for,
        )

    def reset(self, everything=False):
        """Re-arms the guard; with ``everything``, also forgets earlier steps."""
        self.tripped.assign(False)
        if self.spikes is not None:
            self.spikes.reset(everything)
        if everything:
            self.trip_step.assign(-1)
            self.counts.assign(tf.zeros_like(self.counts))
            self.last_finite_step.assign(-1)
            self.last_finite_half_squares.assign(tf.zeros_like(self.last_finite_half_squares))

