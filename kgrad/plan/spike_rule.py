"""The spike rule of `kgrad.NonFiniteGuard` (``skip_spikes=``): its options and its host-side reference.

A step *spikes* when the logarithm of its loss or of its global gradient
norm exceeds the mean plus k standard deviations of the same logarithm over
the last N accepted steps (OLMo-core's ``SkipStepOptimizer`` and MaxText's
``skip_step_on_spikes`` judge the values themselves). Each backend judges it
inside the step, on the device (`kgrad.backends.tensorflow.guard.spikes`,
`kgrad.backends.jax.guard.spikes`); `judge` is the same rule in NumPy, the
reference the tests compare them with.

Why logarithms: a small batch's loss and gradient norm are heavy-tailed on
the right (a batch's loss is an average of few positive terms). Judged as
they are, 6σ was crossed on clean runs: 44 of 2000 steps of a ReLU MLP with 4
examples a batch, 14 of `kgrad demo`'s ReLU MLP; judged as logarithms, none
(docs/guard.md, "False alarms"; ``benchmarks/spike_false_alarms.py``). σ is
taken as at least `MIN_LOG_SIGMA`: on a plateau whose loss hardly moves, a
batch 1.2× the others is not a spike (`kgrad demo`'s sigmoid MLP at chance,
on JAX). A loss that is not positive (a critic's, a cosine similarity) has no
logarithm: where the window holds one, the loss is not judged, the gradient
norm still is.

The window holds one row per accepted step: the logarithms of the loss and
of the global gradient norm, then each trainable weight's gradient norm as
it is (the z-scores of a skipped step's per-weight values are taken against
those columns: they rank the weights of a step already judged, as the
report's spike rule ranks probes, on the values themselves). σ is the sample
standard deviation (n − 1), as ``torch.std`` in OLMo-core.

Example:

>>> import numpy as np
>>> window = np.array([[1.0, 2.0], [1.2, 2.2], [0.8, 1.8], [1.0, 2.0]])
>>> spike, score = judge(window, np.array([1.0, 9.0]), SpikeRule(sigmas=6, window=4))
>>> bool(spike), round(score, 2)
(True, 18.38)
"""

import dataclasses
import typing

import numpy as np

#: The columns of the per-step rows each backend buffers on the device, written as
#: ``global/step_skipped``, ``global/spike_score`` and ``spike_window_{mean,std}/{log_loss,log_grad_norm}``.
ROW_COLUMNS = ("step", "skipped", "score", "mean_log_loss", "std_log_loss", "mean_log_grad_norm",
               "std_log_grad_norm")

#: The least σ of a logarithm in the window: a spike is at least e^(k·0.05) times the window's
#: geometric mean (1.35× at k = 6), however still the values were.
MIN_LOG_SIGMA = 0.05

#: The per-weight values of a skipped step, in the order the backends compute them.
SKIP_VALUES = ("grad_norm", "update_ratio", "cos_grad_weight", "adam_rms")

#: Rows of per-step values kept on the device between host reads, when the epoch's length is unknown.
DEFAULT_ROW_CAPACITY = 1024

#: Skipped steps whose per-weight values are kept on the device between host reads.
SKIP_SLOTS = 8


@dataclasses.dataclass(frozen=True)
class SpikeRule:
    """When a step spikes, and when skipping stops training.

    Args:
        sigmas: k: a value above mean + k·σ of the window spikes.
        window: N: the last N accepted steps (spiking steps never enter it).
        warmup: Accepted steps before any step is judged (``None``: ``window``,
            a full window, as OLMo-core waits for its full history).
        max_skips: M: this many skipped steps in a row stop training with a
            report, as a NaN does.
        row_capacity: Rows of per-step values kept on the device between
            host reads (set by the guard from the epoch's length).
        sample_every: s: one step run in s is a sample of the applied
            update (`SAMPLED_VALUES`) for a skipped step's z-scores (``None``:
            ``max(1, window // 2)``, 64 for the default window: a sample step
            costs about one more step's optimizer pass, so a denser default
            would make skipping dear on small models; see `sample_every`).
    """

    sigmas: float = 6.0
    window: int = 128
    warmup: object = None
    max_skips: int = 3
    row_capacity: int = DEFAULT_ROW_CAPACITY
    sample_every: object = None

    def __post_init__(self):
        if self.sample_every is None:
            every = max(1, self.window // 2) if _positive_int(self.window) else 1
            object.__setattr__(self, "sample_every", every)
        for name in ("sigmas", "window", "max_skips", "row_capacity", "sample_every"):
            value = getattr(self, name)
            kind = (int, float) if name == "sigmas" else (int,)
            if isinstance(value, bool) or not isinstance(value, kind) or not 0 < value < float("inf"):
                raise ValueError(
                    f"`{_ARGUMENTS[name]}` must be a positive {'number' if name == 'sigmas' else 'int'}. "
                    f"Received: {_ARGUMENTS[name]}={value!r}. Example: {_ARGUMENTS[name]}="
                    f"{_EXAMPLES[name]}."
                )
        warmup = self.window if self.warmup is None else self.warmup
        if isinstance(warmup, bool) or not isinstance(warmup, int) or not 2 <= warmup <= self.window:
            raise ValueError(
                f"`spike_warmup` must be None or an int from 2 to spike_window ({self.window}): "
                f"σ needs two accepted steps, and the window holds spike_window. Received: "
                f"spike_warmup={self.warmup!r}. Example: spike_warmup=32."
            )
        object.__setattr__(self, "warmup", warmup)


_ARGUMENTS = {"sigmas": "spike_sigmas", "window": "spike_window", "max_skips": "max_skips",
              "row_capacity": "row_capacity", "sample_every": "spike_sample_every"}
_EXAMPLES = {"sigmas": 6, "window": 128, "max_skips": 3, "row_capacity": 1024, "sample_every": 8}


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def judge(window, values, rule):
    """``(spikes, score)`` of one step: NumPy's reading of the rule both backends compute.

    Args:
        window: ``[accepted steps, k]``: the accepted steps' values (the last
            ``rule.window`` of them are used), the first two columns the
            loss and the global gradient norm.
        values: The step's loss and global gradient norm.
        rule: The `SpikeRule`.

    Returns:
        Whether the step spikes, and its score: the largest
        (ln x − mean)/max(σ, `MIN_LOG_SIGMA`) of the two, over the window's
        logarithms (``None`` during the warm-up, or where neither can be
        judged: a loss that is not positive has no logarithm).
    """
    window = np.asarray(window, np.float64)[-rule.window:, :2]
    if len(window) < rule.warmup:
        return False, None
    with np.errstate(divide="ignore", invalid="ignore"):
        logs, step = log_values(window), log_values(np.asarray(values, np.float64)[:2])
    mean, std = logs.mean(axis=0), logs.std(axis=0, ddof=1)
    judged = np.isfinite(mean) & np.isfinite(step)
    if not judged.any():
        return False, None
    score = float(np.max((step[judged] - mean[judged]) / np.maximum(std[judged], MIN_LOG_SIGMA)))
    return score > rule.sigmas, score


def log_values(values):
    """ln of each value, NaN for one that is not positive (no logarithm); a 0 norm as float32's smallest."""
    values = np.asarray(values, np.float64)
    logs = np.log(np.maximum(values, np.finfo(np.float32).tiny))
    logs[..., :1] = np.where(values[..., :1] > 0, logs[..., :1], np.nan)  # the loss
    return logs


#: The columns of a skipped step's per-weight table on the device: `SKIP_VALUES`, then each
#: value's z-score (the gradient norm's against its column of the window, the others' against
#: the weight's samples, `SAMPLED_VALUES`), then how many samples those were.
SKIP_COLUMNS = SKIP_VALUES + tuple(f"z_{name}" for name in SKIP_VALUES) + ("samples",)

#: The per-weight values of the update actually applied, sampled every `sample_every` accepted
#: steps into a second device window of `sample_slots` samples (the skip's z-scores of these are
#: taken against it): the gradient norm is kept every accepted step, from sums of squares the guard
#: computes anyway, but these need a pass over every parameter.
SAMPLED_VALUES = SKIP_VALUES[1:]

#: Samples per weight kept in the window of `SAMPLED_VALUES` (at most; fewer for a window shorter).
SAMPLE_SLOTS = 16


def sample_slots(rule):
    """S: samples kept per weight, ``min(SAMPLE_SLOTS, rule.window)``.

    >>> sample_slots(SpikeRule(window=128)), sample_slots(SpikeRule(window=8))
    (16, 8)
    """
    return min(SAMPLE_SLOTS, rule.window)


def sample_every(rule):
    """s: every s-th step run is a sample step (``spike_sample_every``; default ``max(1, N // 2)``).

    A sample step whose update is skipped gives no sample: the samples measure applied
    updates. Both backends count steps run, not accepted steps: JAX's host picks a sample
    step's program without reading the device, which holds the count of accepted steps (a
    read would sync every step; a sample branch inside every step costs every step).
    The default keeps the samples' cost near 1/64 of a sample step's on the default window
    (a sample step costs about one optimizer pass more; every 8 steps it made skipping cost
    1.20 of the guard on TensorFlow's benchmark MLP, 1.13 on JAX's). The S samples then
    span S·s steps (1,024 for the defaults), longer than the gradient norm's window:
    an update's ratio, angle and ``adam_rms`` drift slowly. A smaller s gives z-scores sooner
    (after 2s steps), against more recent samples, at more cost.

    >>> [sample_every(SpikeRule(window=n)) for n in (128, 32, 3)]
    [64, 16, 1]
    >>> sample_every(SpikeRule(window=128, sample_every=8))
    8
    """
    return rule.sample_every


def sampled_z_scores(samples, count, values):
    """NumPy reference: ``[weights, len(SAMPLED_VALUES)]`` z-scores of ``values`` against ``samples``.

    Args:
        samples: ``[S, weights, len(SAMPLED_VALUES)]``: the sample window (slot ``i % S`` of sample ``i``).
        count: Samples written since the fit began.
        values: ``[weights, len(SAMPLED_VALUES)]``: a skipped step's values.

    Returns:
        (value − mean) / σ (n − 1) over the finite ones of the ``min(count, S)``
        samples; NaN where fewer than 2 are finite, σ is 0, or a value is NaN.

    >>> samples = np.array([[[1.0]], [[3.0]]])
    >>> float(sampled_z_scores(samples, 2, np.array([[4.0]]))[0, 0])
    1.414213562373095
    """
    filled = np.asarray(samples, np.float64)[: min(count, len(samples))]
    finite = np.isfinite(filled)
    with np.errstate(divide="ignore", invalid="ignore"):
        n = finite.sum(axis=0)
        mean = np.where(finite, filled, 0.0).sum(axis=0) / n
        std = np.sqrt(np.where(finite, (filled - mean) ** 2, 0.0).sum(axis=0) / (n - 1))
        return np.where((n >= 2) & (std > 0), (np.asarray(values, np.float64) - mean) / std, np.nan)


class SpikeSnapshot(typing.NamedTuple):
    """What the host reads of a backend's spike state (NumPy values).

    Attributes:
        rows: ``[capacity, len(ROW_COLUMNS)]``: per-step rows, row ``i % capacity`` of step row ``i``.
        row_count: Rows written since the fit began.
        skip_values: ``[SKIP_SLOTS, weights, len(SKIP_COLUMNS)]``: the latest skipped steps' tables.
        skip_steps: ``[SKIP_SLOTS]``: their step numbers.
        skip_count: Skipped steps recorded since the fit began.
        tripped: Whether ``max_skips`` skips in a row have happened.
        weights: The weight paths of the tables' rows.
        adam_reason: Why ``adam_rms`` is absent (the optimizer keeps no second moment), or ``None``.
        sample_every: s: one step run in s is sampled for the z-scores of `SAMPLED_VALUES`.
        sample_reason: Why those z-scores are absent where no samples are kept, or ``None``.
    """

    rows: object
    row_count: int
    skip_values: object
    skip_steps: object
    skip_count: int
    tripped: bool
    weights: tuple
    adam_reason: object = None
    sample_every: int = 1
    sample_reason: object = None
