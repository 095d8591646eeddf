"""`NonFiniteGuard`: stop at the first NaN/Inf and say where it was born."""

import dataclasses
import functools
import os
import sys
import warnings

import keras

from kgrad import backends
from kgrad.backends.common import batch_dump
from kgrad.callbacks import guard_replay, one_per_fit
from kgrad.callbacks.spike_skipping import spike_skipping
from kgrad.logs.writer import write_guard_report
from kgrad.plan.options import SENTINEL_KINDS, GuardConfig
from kgrad.report.non_finite import NonFiniteError, name_in_part
from kgrad.sinks.fanout import SinkSet, checked_sinks

_ACTIONS = ("stop", "warn", "raise")


class NonFiniteGuard(keras.callbacks.Callback):
    """Stops at the first NaN/Inf of a training step and names the operation where it was born.

    Keras' ``TerminateOnNaN`` sees the loss only; ``tf.debugging`` checks slow every
    step and do not work under ``jit_compile``. Every step, inside the compiled step
    (also under XLA), this guard checks only a sentinel: the loss and the weight
    gradients, what can reach the weights (one cheap reduction per tensor and one
    scalar flag, returned with the logs that Keras reads after each execution
    anyway). When a step goes non-finite, its update is **not applied**, and the
    guard **replays** that step eagerly on its own batch (kept on the device, never
    copied on clean steps) from the weights before the bad update, with every layer,
    nested layer, ``keras.ops`` node and `kgrad.tap` captured, forward and backward
    (each backend's replay; `kgrad.backends.common.locate` names the place). The
    report (`kgrad.NonFiniteReport`) says where the first NaN/Inf was born: in the
    forward pass (the first operation whose inputs are finite and whose output is
    not), in the backward pass (from the loss down), with the input data (and the
    batch index in the epoch) or in the weights (an earlier update), with its type,
    path, NaN/Inf counts and the finite range of its input.

    On Keras' JAX backend the sentinel runs inside the jitted step, the replay
    under ``jit``, and with ``action`` "stop" or "raise" the report comes at
    the epoch's end (`kgrad.backends.jax.guard`; docs/guard.md says what
    differs).

    Args:
        action: ``"stop"`` (stop training, keep the last finite weights),
            ``"warn"`` (warn, skip the bad update, go on) or ``"raise"``
            (raise `kgrad.NonFiniteError`, whose ``.report`` says where).
        watch: What is checked every step, besides the loss: by default
            ``("weight_gradients",)``, the cheapest check that keeps every
            update with a non-finite gradient out of the weights (it lets
            through a NaN masked out before the loss or an Inf that
            saturates, ``sigmoid(inf) == 1``, which cannot reach the
            weights; an update whose gradients are finite can still
            overflow a weight: the next step trips and the replay names
            that weight and the step of its update); ``"all"``
            or a subset of ``("inputs", "activations", "prediction_gradient",
            "activation_gradients", "weight_gradients")`` to check more
            every step (``report.tensor`` then names the first of them).
        layers: Layers whose activations and gradients are checked, when
            ``watch`` includes them:
            ``None`` (every leaf layer with weights), ``"all"``, names, layer
            objects or a predicate.
        ignore_loss_scale_skips: Under mixed precision, a
            ``LossScaleOptimizer`` makes gradients overflow on purpose and
            skips those steps itself; by default only the forward pass is
            checked then, so expected skips do not stop training.
        log_dir: If given, each report is also written to ``<log_dir>/kgrad``
            (tag ``guard/report``, see `kgrad.logs.writer.write_guard_report`),
            where the kgrad tab of TensorBoard shows it.
        dump_dir: If given, a tripped step's batch (``step_<step>.npz``) and
            the model at the last finite weights (``step_<step>.keras``) are
            written there, and the report prints the three lines of Python
            that replay the step from them (refused with several JAX
            processes, where no process holds the whole model).
        replay: Whether a trip is replayed to locate where the NaN was born.
        sinks: Trackers that also get each report and, with ``log_dir``, the HTML report of
            ``log_dir`` at the trip (`kgrad.WandbSink`...; see `kgrad.GradientProbe`).
        skip_spikes: Also skip the update of a step whose loss or global gradient norm has
            a logarithm above mean + ``spike_sigmas``·σ (σ ≥ 0.05) of the last
            ``spike_window`` accepted steps', judged on the device (no host
            read on a step that does not spike), skipped as a NaN step is;
            ``max_skips`` skips in a row stop training with a report
            (`spike_report`). docs/guard.md, "Skip a spiking step".
        spike_sigmas, spike_window, spike_warmup, max_skips, spike_sample_every: k (6, as
            OLMo-core), N accepted steps (128), steps before the window judges (``None``: N), M
            (3), and one step run in s sampled for a skipped step's z-scores of its
            update (``None``: N // 2; `kgrad.plan.spike_rule.sample_every`).

    Attributes:
        report: The `kgrad.NonFiniteReport` of the first bad step, or ``None``.
        reports: Every report of this fit (several with ``action="warn"``).
        skipped_steps: With ``skip_spikes``, the steps skipped for a spike
            (`kgrad.callbacks.spike_log.SkippedStep`, per-weight values).
        spike_report: Why ``skip_spikes`` stopped training, or ``None``.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> model = keras.Sequential([keras.Input((2,)),
    ...     keras.layers.Dense(4, kernel_initializer="ones", name="hidden"),
    ...     keras.layers.Lambda(lambda t: keras.ops.log(t), name="log"),
    ...     keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> guard = kgrad.NonFiniteGuard()
    >>> _ = model.fit(-np.ones((4, 2)), np.ones((4, 1)), callbacks=[guard], verbose=0)  # log(-2)
    >>> r = guard.report
    >>> r.step, r.born_in, r.born_at, r.born_type
    (0, 'forward', 'log', 'Lambda')
    """

    def __init__(self, action="stop", watch=SENTINEL_KINDS, layers=None, ignore_loss_scale_skips=True,
                 log_dir=None, dump_dir=None, replay=True, sinks=None, skip_spikes=False, spike_sigmas=6.0,
                 spike_window=128, spike_warmup=None, max_skips=3, spike_sample_every=None):
        super().__init__()
        # A backend kgrad does not run on is named here, before fit starts or any folder exists.
        backends.current().check_supported("guard")
        if action not in _ACTIONS:
            raise ValueError(
                f"`action` must be one of {list(_ACTIONS)}. Received: action={action!r}."
            )
        if not isinstance(ignore_loss_scale_skips, bool):
            raise TypeError(
                "`ignore_loss_scale_skips` must be True or False. Received: "
                f"ignore_loss_scale_skips={ignore_loss_scale_skips!r}."
            )
        if dump_dir is not None and not isinstance(dump_dir, (str, os.PathLike)):
            raise TypeError(
                "`dump_dir` must be None or a folder path (str or os.PathLike). Received: "
                f"dump_dir={dump_dir!r} of type {type(dump_dir).__name__}. Example: dump_dir='nan_dump'."
            )
        self.action = action
        dump_dir = None if dump_dir is None else os.fspath(dump_dir)
        self.config = GuardConfig(layers=layers, watch=watch, ignore_loss_scale_skips=ignore_loss_scale_skips,
                                  halt_updates=action != "warn")
        self.report = None
        self.reports = []
        if not isinstance(replay, bool):
            raise TypeError(f"`replay` must be True or False. Received: replay={replay!r}.")
        self._spikes = spike_skipping(skip_spikes, spike_sigmas=spike_sigmas, spike_window=spike_window,
                                      spike_warmup=spike_warmup, max_skips=max_skips,
                                      spike_sample_every=spike_sample_every)
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.dump_dir = dump_dir
        self.replay = replay
        self._sinks = SinkSet(checked_sinks(sinks), "NonFiniteGuard")
        self._step = None
        self._trip_pending = False

    @property
    def async_safe(self):
        """Keras' JAX trainer may run this callback's batch ends in another thread.

        On JAX with ``action`` "stop" or "raise", a batch end only reads the
        trip flag, once the device has computed it (and asks training to
        stop); the report waits for the epoch's end (`reports_at_epoch_end`),
        so Keras keeps dispatching steps without waiting for the device. TensorFlow's trainer never
        dispatches batch ends asynchronously.
        """
        return self.action != "warn"

    def on_train_begin(self, logs=None):
        one_per_fit.claim(self, "NonFiniteGuard")
        self._writes = backends.current().is_chief(self.model)  # every worker guards, the chief writes
        self._sinks.open(enabled=self._writes)
        try:
            if self._spikes is not None:
                rule = self._spikes.rule_for(self.model, (self.params or {}).get("steps"))
                self.config = dataclasses.replace(self.config, spikes=rule)
                self._spikes.start(self._writes and self.log_dir or None, self.model.optimizer.iterations)
            if self.dump_dir is not None:  # what the step computes does not depend on it
                backends.current().check_dump(self.dump_dir)
            self._step = backends.current().attach(self.model, "guard", self.config)
        except BaseException:
            self._sinks.close()  # Keras calls no on_train_end when on_train_begin raises
            raise
        self.report, self.reports, self._trip_pending = None, [], False

    def on_epoch_begin(self, epoch, logs=None):
        self._step.start_epoch()

    @property
    def skipped_steps(self):
        return [] if self._spikes is None else self._spikes.skipped

    @property
    def spike_report(self):
        return None if self._spikes is None else self._spikes.stop_report

    def on_epoch_end(self, epoch, logs=None):
        if self._spikes is not None:
            self._read_spikes()
        tripped = self._step.guard_tripped
        if getattr(self._step, "reports_at_epoch_end", False) and tripped is not None and bool(tripped):
            self._trip_pending = True  # a trip whose flag no batch end read
        if self._trip_pending:
            self._trip_pending = False
            self._report_trip(None)

    def on_train_end(self, logs=None):
        if self._spikes is not None:
            self._spikes.close()
        backends.current().detach(self.model, "guard")
        self._sinks.close()

    def on_train_batch_end(self, batch, logs=None):
        tripped = self._step.guard_tripped
        if tripped is None:
            return
        deferred = getattr(self._step, "reports_at_epoch_end", False)
        if self._spikes is not None and self._read_spikes(deferred, after=self._step):
            return
        if deferred:
            # JAX: a scalar, read in Keras' worker thread once the device has computed
            # it, never waited for: a wait per batch end kept Keras' worker behind its
            # dispatch, and Keras polls every pending batch end at each step (~0.1 of
            # an MLP step). A flag not read here is read at the epoch's end.
            if not tripped.is_ready() or not bool(tripped):
                return
            # Every later step keeps the state of before the trip; `Callback.model`
            # would sync the trainer's state from this thread: the object only.
            self._model.stop_training = True
            self._trip_pending = True
            return
        # TensorFlow: the flag came back with the step's logs, which Keras has
        # already read from the device.
        if bool(tripped):
            self._report_trip(batch)

    def _read_spikes(self, deferred=False, after=None):
        """Reads the spike rule's state (``after`` a step: on news only); acts on a streak. Whether it did."""
        with self._spikes.lock:  # Keras' worker threads run batch ends side by side: one read a news
            if after is not None and not self._spikes.news(after, self._model.steps_per_execution):
                return False
            self._spikes.read(self._step.guard_states(), self._model.optimizer)
            return self._spikes.act(self, deferred)

    def _report_trip(self, batch):
        """Reads the trip's report, replays it and acts (``batch``: Keras' index, ``None`` if unknown)."""
        report = None
        # One state for the model, or one per ProbeTape (kgrad.value_and_grad on JAX) of its own train_step.
        states = self._step.guard_states()
        for tape, candidate in states.items():
            report = candidate.read_report(functools.partial(guard_replay.latest_summaries, self._step, tape))
            if report is not None:
                if tape is not None:  # a ProbeTape or kgrad.value_and_grad of its own train_step
                    counts = {name_in_part(name, tape): count for name, count in report.non_finite.items()}
                    report = dataclasses.replace(report, layer=f"{tape}/{report.layer}",
                                                 tensor=name_in_part(report.tensor, tape), non_finite=counts)
                break
        if report is None:
            return
        report = self._replayed(report, batch)
        self.reports.append(report)
        self.report = self.report or report
        if self.log_dir is not None and self._writes:
            write_guard_report(self.log_dir, report)
        self._sinks.guard_report(report)
        self._sinks.html_report(self.log_dir, report.step, "nonfinite")
        if self.action == "warn":
            # Every tape of the step that tripped: one report for the step.
            for state in states.values():
                state.reset()
            warnings.warn(f"kgrad.NonFiniteGuard: {report}", RuntimeWarning, stacklevel=2)
            return
        self.model.stop_training = True
        if self.action == "raise":
            # Keras calls no on_train_end when a callback raises.
            backends.current().detach(self.model, "guard")
            self._sinks.close()
            raise NonFiniteError(report)
        weights = ("The weights are not finite: an update with finite gradients made them so."
                   if report.born_in == "weights" else "The weights are those of the last finite step.")
        print(f"kgrad.NonFiniteGuard stopped training: {report.message(closing=weights)}", file=sys.stderr)

    def _replayed(self, report, batch):
        """``report`` with where the NaN was born (`guard.replay`), and the dump's three lines."""
        spe = self.model.steps_per_execution
        kept = self._step.tripped_batch()
        data, seeds_after, kept_index = (None, None, None) if kept is None else kept
        # With several steps per execution, Keras gives the execution's last
        # batch index: the tripped step's own was counted on the device.
        fields = {"batch_index": batch if spe == 1 and batch is not None else kept_index}
        if data is None:
            reason = self._step.batch_not_kept() or "the step's batch was not kept"
            fields["replay_note"] = reason if reason.startswith("Not replayed:") else (
                f"Not replayed: with steps_per_execution={spe} the guard keeps the tripped step's "
                f"batch in variables, and here {reason}; fit with steps_per_execution=1 to locate "
                "the NaN."
            )
        elif self.replay:
            fields.update(guard_replay.replay_fields(self.model, report, data, seeds_after))
        if self.dump_dir is not None and data is not None:
            lines, note = batch_dump.dump(self.model, data, self.dump_dir, report.step)
            fields["reproduce"] = lines
            if note:
                fields["replay_note"] = batch_dump.join_notes(fields.get("replay_note"), note)
        return dataclasses.replace(report, **fields)
