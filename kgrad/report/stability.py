"""Spikes, and what moved before a loss spike: pure functions on `kgrad.read_logs` output.

The rule is OLMo-core's ``StabilityMonitorCallback``'s: a probe *spikes* when its
value exceeds mean + 6σ of the previous 128 probes of the same signal (finite
values only; a NaN or Inf value after finite ones is a spike too: the blow-up
itself). With fewer than ``min_history`` previous probes nothing is marked: σ of
a handful of values says nothing. The signals:

- ``global/loss`` (the loss of each probed step) and ``global/grad_norm``;
- ``adam_rms/<weight path>`` (``instruments=["optimizer"]``), of the weight's layer;
- ``logit_max_max/<output>`` (``instruments=["logits"]``), of that output;
- ``attention_logit_max/<layer>`` (``instruments=["attention"]``): per attention
  layer, the largest of its heads' ``attention_logit_max/<layer>/head_<h>`` at each
  probe (attention logit growth precedes loss spikes, Dehghani et al. 2023).

For each loss spike, the layers (and outputs) whose signals spiked inside the
window of probes before it (``window``, 16 by default, the loss spike's own probe
included), each at its first spike there, earliest first: what moved first.
Signals that spiked at the same probe are a tie (`ties`), ordered by their size
(σ above their mean), never by the layers' forward order.

A weight whose gradient is rounding noise beside its layer's other weights (an
attention layer's key bias; `kgrad.report.spike_rules.rounding_noise`, on each
weight's median ``weight_grad_norm/`` over the run) is not scored: its
``adam_rms/`` tag is left out, in ``not_scored`` with the reason. Without
``weight_grad_norm/`` tags (``capture`` without ``"weight_gradients"``) the rule
has nothing to judge by, and every weight is scored.

Example:

>>> import numpy as np
>>> from kgrad.logs.reading import Series
>>> steps = np.arange(40)
>>> loss = np.r_[np.ones(30) + 0.01 * np.sin(steps[:30]), np.full(10, 9.0)]
>>> rms = np.r_[np.ones(27) + 0.01 * np.cos(steps[:27]), np.full(13, 5.0)]
>>> scalars = {"global/loss": Series(steps, loss), "adam_rms/dense/kernel": Series(steps, rms)}
>>> report = stability_report(scalars)
>>> [(spike.step, [(lead.layer, lead.step) for lead in spike.leaders]) for spike in report.loss_spikes]
[(30, [('dense', 27)])]
"""

import dataclasses
import math

import numpy as np

from kgrad.plan.tag_names import GRAD_NORM_TAG, LOSS_TAG
from kgrad.report.spike_rules import rounding_noise
from kgrad.report.stability_words import describe, ties  # noqa: F401 (the report's words, here as before)

#: Tag prefixes of the per-layer (per-output) signals, and how a report names them.
LAYER_SIGNALS = {
    "adam_rms/": "adam_rms",
    "logit_max_max/": "max logit",
    "attention_logit_max/": "attention logit max",
}
_HEAD_PREFIX = "attention_logit_max/"


@dataclasses.dataclass(frozen=True)
class Spike:
    """One probe above mean + ``sigmas``·σ of the probes before it.

    Attributes:
        tag: The signal's tag.
        step: The probed step.
        value: Its value there (NaN or Inf for a blow-up).
        mean: The mean of the previous probes (up to ``history``).
        std: Their standard deviation.
    """

    tag: str
    step: int
    value: float
    mean: float
    std: float


@dataclasses.dataclass(frozen=True)
class Lead:
    """A layer whose signal spiked in the window before a loss spike.

    Attributes:
        layer: The layer (``adam_rms/``: the weight path less its last part) or output.
        signal: ``"adam_rms"`` or ``"max logit"``.
        tag: The tag that spiked.
        step: The step of its first spike in the window.
        probes_ahead: Probes between it and the loss spike (0: the same probe).
        sigmas: Its size there: σ above the mean of its previous probes
            (``inf`` for a NaN/Inf value or a σ of 0).
    """

    layer: str
    signal: str
    tag: str
    step: int
    probes_ahead: int
    sigmas: float = math.nan


@dataclasses.dataclass(frozen=True)
class LossSpike:
    """A spike of ``global/loss`` and its ``leaders``: earliest first; at one probe (a tie), largest first."""

    step: int
    value: float
    mean: float
    std: float
    leaders: tuple = ()


@dataclasses.dataclass(frozen=True)
class StabilityReport:
    """What `stability_report` found in one run.

    Attributes:
        spikes: ``dict`` tag -> tuple of `Spike`, for every signal that spiked.
        loss_spikes: One `LossSpike` per spike of ``global/loss``.
        signals: The tags examined.
        sigmas, history, window: The rule's parameters.
        not_scored: ``(tag, reason)`` pairs: signals left out as rounding noise.
    """

    spikes: dict
    loss_spikes: tuple
    signals: tuple
    sigmas: float = 6.0
    history: int = 128
    window: int = 16
    not_scored: tuple = ()


def spike_indices(values, sigmas=6.0, history=128, min_history=8):
    """Indices of the values above mean + ``sigmas``·σ of the (finite) ``history`` values before each.

    Example:

    >>> spike_indices([1.0, 1.1, 0.9, 1.0, 5.0, 1.0], min_history=3)
    [4]
    >>> spike_indices([1.0, 1.0, 1.0, float("nan")], min_history=3)
    [3]
    """
    values = np.asarray(values, dtype=np.float64)
    found = []
    for index in range(len(values)):
        before = values[max(0, index - history) : index]
        before = before[np.isfinite(before)]
        if len(before) < min_history:
            continue
        value = values[index]
        if not np.isfinite(value) or value > before.mean() + sigmas * before.std():
            found.append(index)
    return found


def signal_tags(scalars):
    """The tags of ``scalars`` that `stability_report` examines, loss and global norm first."""
    tags = [tag for tag in (LOSS_TAG, GRAD_NORM_TAG) if tag in scalars]
    return tags + [tag for tag in scalars if tag.startswith(tuple(LAYER_SIGNALS)) and not _is_head(tag)]


def _is_head(tag):
    return tag.startswith(_HEAD_PREFIX) and tag.rpartition("/")[2].startswith("head_")


def with_layer_head_maxima(scalars):
    """``scalars`` and, per attention layer, ``attention_logit_max/<layer>``: the max over its heads.

    Heads written at other steps than the layer's first head (never, from one
    probe) are left out of its maximum. A non-finite head makes the maximum
    non-finite (a blow-up is a spike).

    >>> import numpy as np
    >>> from kgrad.logs.reading import Series
    >>> heads = {f"attention_logit_max/mha/head_{h}": Series(np.arange(2), np.array([h, 3.0 - h]))
    ...          for h in range(2)}
    >>> with_layer_head_maxima(heads)["attention_logit_max/mha"].values.tolist()
    [1.0, 3.0]
    """
    layers = {}
    for tag in scalars:
        if _is_head(tag):
            layers.setdefault(tag.rpartition("/")[0], []).append(scalars[tag])
    combined = dict(scalars)
    for layer, heads in layers.items():
        steps = np.asarray(heads[0].steps)
        same = [np.asarray(head.values, np.float64) for head in heads if np.array_equal(head.steps, steps)]
        # np.max, not np.nanmax: a NaN head is a blow-up, not a missing value.
        combined[layer] = type(heads[0])(steps, np.max(np.stack(same), axis=0))
    return combined


def layer_of(tag):
    """``(layer or output, signal name)`` of a per-layer signal's tag.

    >>> layer_of("adam_rms/block_1/attention/query/kernel"), layer_of("logit_max_max/output")
    (('block_1/attention/query', 'adam_rms'), ('output', 'max logit'))
    """
    prefix, _, name = tag.partition("/")
    signal = LAYER_SIGNALS[prefix + "/"]
    return (name.rpartition("/")[0] or name, signal) if prefix == "adam_rms" else (name, signal)


def stability_report(scalars, sigmas=6.0, history=128, window=16, min_history=8):
    """Spikes of a run's signals and, for each loss spike, the layers that spiked first.

    Args:
        scalars: One run's ``scalars`` from `kgrad.read_logs` (tag -> ``Series``).
        sigmas: How many standard deviations above the mean make a spike.
        history: How many previous probes the mean and σ are of.
        window: How many probes before a loss spike to look for the layers' spikes.
        min_history: Fewest previous (finite) probes for a spike to be marked.

    Returns:
        A `StabilityReport`.
    """
    scalars = with_layer_head_maxima(scalars)
    not_scored = rounding_noise_tags(scalars)
    tags = [tag for tag in signal_tags(scalars) if tag not in dict(not_scored)]
    spikes = {}
    for tag in tags:
        series = scalars[tag]
        found = spike_indices(series.values, sigmas, history, min_history)
        if found:
            spikes[tag] = tuple(_spike(tag, series, index, history) for index in found)
    loss_spikes = ()
    if LOSS_TAG in spikes:
        loss_steps = np.asarray(scalars[LOSS_TAG].steps)
        loss_spikes = tuple(
            _loss_spike(spike, loss_steps, spikes, window) for spike in spikes[LOSS_TAG]
        )
    return StabilityReport(spikes, loss_spikes, tuple(tags), sigmas, history, window, not_scored)


def rounding_noise_tags(scalars):
    """``(adam_rms tag, reason)`` of the weights whose gradient is rounding noise over the run.

    Judged on each weight's median ``weight_grad_norm/`` over its finite probes
    beside its layer's other weights' (`kgrad.report.spike_rules.rounding_noise`).

    >>> import numpy as np
    >>> from kgrad.logs.reading import Series
    >>> steps = np.arange(3)
    >>> scalars = {f"{kind}/mha/key/{part}": Series(steps, np.full(3, norm)) for kind in ("adam_rms", "weight_grad_norm")
    ...            for part, norm in (("kernel", 0.1), ("bias", 3e-10))}
    >>> [tag for tag, _ in rounding_noise_tags(scalars)]
    ['adam_rms/mha/key/bias']
    """
    prefix = "weight_grad_norm/"
    medians = {}
    for tag, series in scalars.items():
        if tag.startswith(prefix):
            finite = np.asarray(series.values, np.float64)
            finite = finite[np.isfinite(finite)]
            if len(finite):
                medians[tag[len(prefix):]] = float(np.median(finite))
    found = rounding_noise(medians, what="median gradient norm over the run")
    return tuple((f"adam_rms/{weight}", reason)
                 for weight, reason in found if f"adam_rms/{weight}" in scalars)


def _spike(tag, series, index, history):
    before = np.asarray(series.values[max(0, index - history) : index], dtype=np.float64)
    before = before[np.isfinite(before)]
    return Spike(tag, int(series.steps[index]), float(series.values[index]),
                 float(before.mean()), float(before.std()))


def _loss_spike(spike, loss_steps, spikes, window):
    position = int(np.searchsorted(loss_steps, spike.step))
    first_step = int(loss_steps[max(0, position - window)])
    leaders = {}
    for tag, found in spikes.items():
        if not tag.startswith(tuple(LAYER_SIGNALS)):
            continue
        inside = [other for other in found if first_step <= other.step <= spike.step]
        if not inside:
            continue
        layer, signal = layer_of(tag)
        ahead = position - int(np.searchsorted(loss_steps, inside[0].step))
        lead = Lead(layer, signal, tag, inside[0].step, ahead, spike_size(inside[0]))
        # One line per layer and signal: its earliest spike (a kernel's or a bias's).
        known = leaders.get((layer, signal))
        if known is None or (lead.step, -lead.sigmas) < (known.step, -known.sigmas):
            leaders[(layer, signal)] = lead
    # Earliest first; a tie (one probe) by size, largest first: never by forward order.
    ordered = sorted(leaders.values(), key=lambda lead: (lead.step, -lead.sigmas))
    return LossSpike(spike.step, spike.value, spike.mean, spike.std, tuple(ordered))


def spike_size(spike):
    """How far above its mean a spike is, in σ: ``inf`` for a NaN/Inf value or a σ of 0.

    >>> spike_size(Spike("t", 3, 5.0, 1.0, 0.5)), spike_size(Spike("t", 3, float("nan"), 1.0, 0.5))
    (8.0, inf)
    """
    if not math.isfinite(spike.value) or spike.std == 0:
        return math.inf
    return (spike.value - spike.mean) / spike.std
