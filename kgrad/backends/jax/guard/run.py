"""The guard of one JAX ``fit``, host side: its record, the kept batches, and the train function.

`GuardRun` runs the guarded steps, keeps their `GuardRecord` (device arrays, passed from step to
step, never read on a clean step: only the trip flag is, after each execution, as TensorFlow's
guard reads it with the logs) and a reference to the batches of the latest execution (no copy),
so that a trip can be replayed on its own batch. It is what `kgrad.NonFiniteGuard` asks
(`kgrad.backends.interface.TrainingStep`, `GuardCheck`). Every guarded step, Keras' own or a
model's own, probed or not, runs with a `kgrad.backends.jax.guard.checked_parts.CheckedParts`
active, and the state of before is kept when a part was not finite or (``skip_spikes``) spiked.
"""

import threading

import jax
import jax.numpy as jnp

from kgrad.backends.common.moment_rules import moment_rule
from kgrad.backends.common.own_step import has_own_train_step
from kgrad.backends.jax.guard import part_spikes
from kgrad.backends.jax.guard import spikes as spike_rule
from kgrad.backends.jax.guard.checked_parts import CheckedParts
from kgrad.backends.jax.guard.donated import donating
from kgrad.backends.jax.guard.kept_batches import KeptBatches
from kgrad.backends.jax.guard.sentinel import (
    dropped_after_trip, initial_record, may_apply, next_record, select_state,
)
from kgrad.backends.jax.handover.train_function import TrainFunction, step_jit
from kgrad.backends.jax.own_step.keras_step import train_step_of
from kgrad.backends.jax.own_step.value_and_grad import activated
from kgrad.plan.options import SENTINEL_KINDS
from kgrad.plan.spike_rule import sample_every
from kgrad.report.non_finite import report_of_counts


class GuardRun:
    """The guard's part of a JAX ``fit`` (`kgrad.backends.interface.TrainingStep` for ``"guard"``).

    Args:
        model: The compiled model.
        config: The `GuardConfig`.
        keras_train_function: Keras' own train function, given back on detach.
    """

    def __init__(self, model, config, keras_train_function):
        self.model, self.config = model, config
        self.keras_train_function = keras_train_function
        self._watch = None if tuple(config.watch) == SENTINEL_KINDS else config
        self._train_step = train_step_of(model)
        # The spike rule judges Keras' own step (one part, one update) behind its check, and each
        # part of a model's own step inside that part's optimizer update (`CheckedParts.judge_parts`).
        own = has_own_train_step(model)
        self._spikes = None if own else config.spikes
        self._part_spikes = config.spikes if own else None
        self._parts = ()  # the own step's parts' (name, weight paths, optimizer), once traced
        self._jit = step_jit(model)
        self._lock = threading.Lock()  # a step's dispatch, or a host read of the record (`donating`)
        # The rows' names are known once the step is traced (a shape-only pass, `_discover`).
        self.names, self._weight_names = None, ()
        self._plain = donating(self._jit, self._guarded(self._step, behind_check=True))
        # Every s-th step run measures its update for the samples: a step of its own (`_is_sample_step`).
        self._sample_every = None if config.spikes is None else sample_every(config.spikes)
        self._sampled = donating(self._jit, self._guarded(self._step, behind_check=True, sampling=True))
        self._probed = {}  # (id(probed step), sampling) -> (probed step, its guarded step)
        self.train_function = TrainFunction(self.model, None, self.keras_train_function)
        self.train_function.guard = self
        self.latest_record = None
        self.reset(everything=True)

    # -- running steps ------------------------------------------------------------------

    def _checked_parts(self, state):
        ignore, judges = self.config.ignore_loss_scale_skips, self.config.spikes is not None
        return CheckedParts(self.model, state[0], None, self._watch, ignore, judges_spikes=judges)

    def _step(self, state, data, checked):
        with activated(checked):
            logs, state = self._train_step(state, data)
        return logs, state, None

    def _guarded(self, step, behind_check=False, sampling=False):
        """``(state, record, data) -> (logs, state, probe records, record)`` of ``step``, guarded.

        ``behind_check``: Keras' step's update runs behind the check
        (`CheckedParts.behind_check`); a probed one only with the spike rule,
        and by a select (`CheckedParts._probed_update`). ``sampling``: a
        sample step of the spike rule (its update measured, `spike_samples`).
        """
        halt_updates = self.config.halt_updates
        compiled = self.model.jit_compile and not self.model.run_eagerly

        def guarded(state, record, data):
            with self._checked_parts(state) as checked:
                if behind_check:
                    checked.behind_check(record, halt_updates, self._spikes, compiled, sampling)
                if self._part_spikes is not None:
                    checked.judge_parts(record.spikes, halt_updates, self._part_spikes, compiled, sampling)
                logs, new_state, probe_records = step(state, data, checked)
            squares, counts = checked.checks()
            # Where the last update was decided after every check, its choice is the step's.
            decision = checked.final_decision()
            apply, chosen, spiked = decision or (may_apply(counts, record, halt_updates), (), None)
            kept = select_state(apply, _as_lists(new_state), _as_lists(state), chosen)
            new_record = next_record(record, squares, counts, apply, checked.checked_step())
            if spiked is not None:
                spikes = spike_rule.record_step(self._spikes, record.spikes, *spiked, apply)
                new_record = new_record._replace(spikes=spikes)
            if self._part_spikes is not None:
                decisions = checked.part_judge.decisions()
                spikes = part_spikes.recorded(self._part_spikes, record.spikes, decisions, apply)
                new_record = new_record._replace(spikes=spikes)
            if probe_records is not None and halt_updates:
                probe_records = dropped_after_trip(probe_records, record.tripped)
            return logs, kept, probe_records, new_record

        return guarded

    def _discover(self, state, data):
        """The record's rows, from a shape-only pass of the step."""
        found = {}

        def shapes_only(state, data):
            with self._checked_parts(state) as checked:
                self._step(state, data, checked)
            checked.checked_step()  # raises, naming what is missing, before any step runs
            found["names"] = tuple(checked.names)
            parts = checked.part_judge.parts
            found["parts"] = tuple((part.name, tuple(part.paths), part.optimizer) for part in parts)
            if self._part_spikes is not None:
                part_spikes.require_every_part_applied(self.model, parts)

        jax.eval_shape(shapes_only, state, data)
        self.names = found["names"]
        if self._part_spikes is not None:
            self._parts = found["parts"]
        self._weight_names = tuple(name for name in self.names if name.startswith("weight_grad/"))
        self.reset(everything=True)

    def run_plain(self, state, data):
        """One guarded step: ``(logs, state)``."""
        if self.names is None:
            self._discover(state, data)
        step = self._sampled if self._is_sample_step() else self._plain
        with self._lock:  # the record's buffers are donated: never while a host read holds them
            logs, state, _, self.record = step(state, self.record, data)
        self._keep(data)
        return logs, state

    def _is_sample_step(self):
        """Whether the step about to run, plain or probed, is a sample step: every s-th step run.

        By steps run on both backends (TensorFlow's `SpikeState.applied_update`): the host picks
        the program without reading the device, which holds the count of accepted steps (a branch
        in the one step instead costs every step, `spike_samples`). A skipped sample step gives none.
        """
        sampled = self._sample_every is not None and self._runs % self._sample_every == 0
        self._runs += 1
        return sampled

    def _initial_record(self):
        record = initial_record(len(self.names))
        if self._part_spikes is not None:  # one window per part
            rule, parts = self._part_spikes, self._parts
            return record._replace(spikes=tuple(spike_rule.initial_record(rule, len(p)) for _, p, _ in parts))
        if self._spikes is None:
            return record
        return record._replace(spikes=spike_rule.initial_record(self._spikes, len(self._weight_names)))

    def spike_news(self):
        """Whether a step was skipped for a spike since the last `read_spikes` (reads a computed scalar)."""
        return self._reads.news(self.skip_count)

    def read_spikes(self, optimizer):
        """Host side: Keras' step's `kgrad.plan.spike_rule.SpikeSnapshot` (an own step's: `guard_states`)."""
        if self._spikes is None or self.record is None:
            return None
        weights = tuple(name.partition("/")[2] for name in self._weight_names)
        with self._lock:
            return self._reads.snapshot(None, self.record.spikes, weights, moment_rule(optimizer)[1],
                                        self._sample_every)

    def read_part_spikes(self, number):
        """Host side: the `SpikeSnapshot` of part ``number`` of a model's own step."""
        if self.record is None:
            return None
        _, paths, optimizer = self._parts[number]
        with self._lock:
            return self._reads.snapshot(
                number, self.record.spikes[number], paths, moment_rule(optimizer)[1], self._sample_every
            )

    def run_probed(self, probed_step, state, data):
        """One guarded probed step, judged as a plain one: ``(logs, state, {run: probe record})``."""
        if self.names is None:
            self._discover(state, data)
        sampling = self._is_sample_step()
        key = (id(probed_step), sampling)
        kept = self._probed.get(key)
        if kept is None or kept[0] is not probed_step:  # the guarded probed step, jitted once (each kind)
            guarded = self._guarded(probed_step, behind_check=self._spikes is not None, sampling=sampling)
            kept = self._probed[key] = (probed_step, donating(self._jit, guarded))
        with self._lock:
            logs, state, probe_records, self.record = kept[1](state, self.record, data)
        self._keep(data)
        return logs, state, probe_records

    def _keep(self, data):
        """Keeps the step's batch (`KeptBatches`: a trip's stays) and its flags, read without waiting."""
        self.guard_tripped = self.record.tripped
        self.skip_count = spike_rule.skip_counts(self.record.spikes, per_part=self._part_spikes is not None)
        seen_trip = self._batches.keep(data, self.record.tripped, self.model.steps_per_execution)
        if seen_trip and self.config.halt_updates:  # later steps change nothing: stop as soon as seen
            self.model.stop_training = True

    # -- what the guard callback asks ---------------------------------------------------

    def start_epoch(self):
        if self.names is not None:  # (not traced yet: the record starts with the first step)
            # Written, not read: the device's batch count restarts without a sync.
            self.record = self.record._replace(batch=jnp.asarray(0, jnp.int32))
        self._batches.restart()

    def steps_run(self):
        return int(self.model.optimizer.iterations.numpy())

    def pipelines(self):
        return {}  # the last finite probed step's summaries are read on TensorFlow only

    def guard_states(self):
        """``{None: self}``, and with a model's own step's parts judged for spikes, one `PartSpikes` each."""
        states = {None: self}
        for number, (name, _, _) in enumerate(self._parts if self._part_spikes is not None else ()):
            states[name] = part_spikes.PartSpikes(self, number)
        return states

    def tripped_batch(self):
        """``(data, None, batch index)`` of the tripped step (its random draws are in the kept state)."""
        batch = int(self.record.trip_batch)
        kept = self._batches.get(batch)
        return None if kept is None else (kept, None, batch)

    def batch_not_kept(self):
        return "the batch of the tripped step was not kept"

    @property
    def reports_at_epoch_end(self):
        """Whether the guard reports a trip at the end of its epoch (on the main thread).

        With ``action`` "stop" or "raise" every step after a trip keeps the state of before it, so
        the report can wait for the epoch's end, where Keras has put the trainer's state back into
        the model: the batch ends only read the flag and may run asynchronously. ``"warn"``
        replays each trip while training goes on: its batch ends run in order.
        """
        return self.config.halt_updates

    # -- GuardCheck -----------------------------------------------------------------------

    def read_report(self, last_summaries_for):
        """Host side: the `NonFiniteReport` of a tripped guard, or ``None`` (reads the record)."""
        with self._lock:
            record = jax.device_get(self.record)
        if not bool(record.tripped):
            return None
        squares = record.last_finite_squares
        return report_of_counts(
            dict(zip(self.names, record.counts)), step=int(record.trip_step),
            last_finite_step=int(record.last_finite_step),
            last_finite_squares=lambda name: float(squares[self.names.index(name)]),
            last_summaries_for=last_summaries_for,
        )

    def reset(self, everything=False):
        """Re-arms the guard (``action="warn"``); with ``everything``, forgets earlier steps too."""
        if everything:
            self.record = None if self.names is None else self._initial_record()
            self._reads = spike_rule.SpikeReads()
            self._runs = 0  # steps run, plain and probed: every `_sample_every`-th is a sample step
            self._batches = KeptBatches()
        else:
            with self._lock:  # (its float buffers are the next step's to donate)
                spikes = self.record.spikes
                if self._part_spikes is not None:  # a streak that was reported: every part judged afresh
                    spikes = tuple(part_spikes.rearmed(part) for part in spikes)
                elif spikes is not None:
                    spikes = part_spikes.rearmed(spikes)
                self.record = self.record._replace(tripped=jnp.asarray(False), spikes=spikes)
            self._batches.restart()  # what follows the trip is kept afresh
        self.guard_tripped = self.skip_count = None


def _as_lists(state):
    """``(trainable, non-trainable, optimizer, metrics)`` as lists: the old and new state's trees match."""
    return tuple(list(values) for values in state)


