"""`kgrad.NonFiniteGuard`'s ``skip_spikes``: its options, its reads and its stop report.

An option of the guard rather than a callback of its own: a spike is skipped
by the guard's own machinery (the same branch of the step that keeps a
non-finite update out of the weights, the same put-back of the forward
pass's state, the same flag read with the logs), and a run that guards
against spikes wants the NaN guard too. Two callbacks would each have to
own the update; one cannot skip what the other applies.
"""

import dataclasses
import sys
import threading
import warnings

from kgrad import backends
from kgrad.callbacks.spike_log import SpikeLog
from kgrad.plan.spike_rule import DEFAULT_ROW_CAPACITY, SpikeRule

#: The most per-step rows kept on the device when the epoch's length is known.
MAX_ROW_CAPACITY = 1 << 16


@dataclasses.dataclass(frozen=True)
class SpikeStopReport:
    """Why the guard stopped training after ``max_skips`` spiking steps in a row.

    Attributes:
        step: The last skipped step.
        skipped: The `kgrad.callbacks.spike_log.SkippedStep`s of the streak (as read).
        rule: The `kgrad.plan.spike_rule.SpikeRule`.
        leaders: The words of `kgrad.report.spike_leaders.rank_skip_leaders` for the last
            skipped step, or ``None`` where none could be ranked.
    """

    step: int
    skipped: tuple
    rule: SpikeRule
    leaders: object = None

    def __str__(self):
        steps = ", ".join(str(s.step) for s in self.skipped) or str(self.step)
        part = self.skipped[-1].part if self.skipped else None
        of = "" if part is None else f" of part {part!r}"  # a ProbeTape, or a kgrad.value_and_grad on JAX
        text = (
            f"{self.rule.max_skips} steps in a row{of} spiked (steps {steps}): the logarithm of the loss "
            f"or of the global gradient norm was above mean + {self.rule.sigmas:g}σ of the last "
            f"{self.rule.window} accepted steps', and each update was skipped. "
            "Skipping does not help a spike that lasts: "
            "the weights are those of before the first of them."
        )
        return text if self.leaders is None else f"{text} {self.leaders}"


#: `kgrad.NonFiniteGuard`'s spike options and their defaults.
SPIKE_OPTION_DEFAULTS = {"spike_sigmas": 6.0, "spike_window": 128, "spike_warmup": None, "max_skips": 3,
                         "spike_sample_every": None}


def spike_skipping(skip_spikes, **options):
    """The guard's `SpikeSkipping` for ``skip_spikes``, or ``None``; refuses options it would ignore.

    >>> spike_skipping(False) is None
    True
    >>> spike_skipping(False, spike_window=32)
    Traceback (most recent call last):
    ...
    ValueError: `spike_window=32` has no effect without skip_spikes=True. Pass skip_spikes=True to skip spiking steps, or leave spike_window out.
    """
    if not isinstance(skip_spikes, bool):
        raise TypeError(f"`skip_spikes` must be True or False. Received: skip_spikes={skip_spikes!r}.")
    options = {**SPIKE_OPTION_DEFAULTS, **options}
    if not skip_spikes:
        for name, value in options.items():
            if value != SPIKE_OPTION_DEFAULTS[name]:
                raise ValueError(
                    f"`{name}={value!r}` has no effect without skip_spikes=True. Pass skip_spikes=True "
                    f"to skip spiking steps, or leave {name} out."
                )
        return None
    return SpikeSkipping(*(options[name] for name in SPIKE_OPTION_DEFAULTS))


class SpikeSkipping:
    """The guard's spike options, validated, and what it has read of the device.

    Args:
        sigmas, window, warmup, max_skips, sample_every: See `kgrad.NonFiniteGuard`.
    """

    def __init__(self, sigmas, window, warmup, max_skips, sample_every=None):
        self.rule = SpikeRule(sigmas=sigmas, window=window, warmup=warmup, max_skips=max_skips,
                              sample_every=sample_every)
        self.logs = {}
        self.stop_report = None
        self.pending = False  # a stop report not yet acted on (JAX: at the epoch's end)
        self._acted = set()
        self._steps_unread = 0
        # Held by the guard from `news` to `act`: Keras' JAX worker threads run batch ends side
        # by side, and two that both saw one skip would read and log it twice.
        self.lock = threading.Lock()

    def rule_for(self, model, steps_per_epoch):
        """The `SpikeRule` of this fit: rows for a whole epoch where its length is known."""
        capacity = DEFAULT_ROW_CAPACITY
        if steps_per_epoch:
            capacity = min(int(steps_per_epoch) + 1, MAX_ROW_CAPACITY)
        self.rule = dataclasses.replace(self.rule, row_capacity=capacity)
        return self.rule

    def start(self, log_dir, iterations):
        """At ``fit``'s start: ``iterations``, the optimizer's (the guard counts skips too)."""
        self.close()
        # `.numpy()`: int() refuses the MirroredVariable of a MirroredStrategy.
        self.log_dir, self.first_step = log_dir, int(iterations.numpy())
        self.logs = {}
        self.stop_report = None
        self.pending = False
        self._acted = set()
        self._steps_unread = 0

    def news(self, step, steps):
        """Whether to read the device after an execution of ``steps`` steps: a skip, or rows to keep.

        ``step``: the backend's training step. TensorFlow's flag came back
        with the logs (a trip, or a skip not yet read); JAX's count of skips
        is read once computed, never waited for. The rows are read before
        the device's buffer would wrap (an epoch's worth when its length is known).
        """
        self._steps_unread += steps
        if self._steps_unread + steps > self.rule.row_capacity:
            return True
        spike_news = getattr(step, "spike_news", None)
        if spike_news is not None:
            return spike_news()
        return bool(step.guard_tripped)

    def read(self, states, optimizer):
        """Reads every part's spike state (a device read); returns the new skipped steps.

        Sets `stop_report` the first time a part has skipped ``max_skips`` steps in a row.
        """
        self._steps_unread = 0
        new = []
        for part, state in states.items():
            snapshot = state.read_spikes(optimizer)
            if snapshot is None:
                continue
            log = self.logs.get(part)
            if log is None:
                log = self.logs[part] = SpikeLog(self.log_dir, part, self.first_step)
            taken = log.take(snapshot)
            new += taken
            if snapshot.tripped and self.stop_report is None:
                streak = tuple(log.skipped[-self.rule.max_skips:])
                last = streak[-1].step if streak else -1
                self.stop_report = SpikeStopReport(last, streak, self.rule, _leaders(streak))
        return new

    def act(self, guard, deferred=False):
        """Acts on a new `stop_report` as ``guard.action`` says; whether there was one to act on.

        ``deferred`` (JAX, in Keras' worker thread): training stops now, the
        report waits for the epoch's end.
        """
        report = self.stop_report
        if report is None or (id(report) in self._acted and not self.pending):
            return False
        self._acted.add(id(report))
        if guard.action == "warn":
            warnings.warn(f"kgrad.NonFiniteGuard: {report}", RuntimeWarning, stacklevel=3)
            for state in guard._step.guard_states().values():
                state.reset()  # the streak is judged afresh
            self.stop_report = None
            return True
        guard._model.stop_training = True
        self.pending = deferred
        if deferred:
            return True
        if guard.action == "raise":
            backends.current().detach(guard._model, "guard")
            guard._sinks.close()
            raise RuntimeError(f"kgrad.NonFiniteGuard: {report}")
        print(f"kgrad.NonFiniteGuard stopped training: {report}", file=sys.stderr)
        return True

    @property
    def skipped(self):
        """Every `kgrad.callbacks.spike_log.SkippedStep` read in this fit, in order."""
        return [s for log in self.logs.values() for s in log.skipped]

    def close(self):
        for log in self.logs.values():
            log.close()


def _leaders(streak):
    """The words of `rank_skip_leaders` for the streak's last step, or ``None``."""
    if not streak:
        return None
    try:
        from kgrad.report.spike_leaders import rank_skip_leaders
    except ImportError:  # the leader rules live with the report
        return None
    last = streak[-1]
    return f"Step {last.step}: {rank_skip_leaders(last.values, last.z_scores).describe()}"
