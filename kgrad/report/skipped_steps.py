"""The steps a `kgrad.NonFiniteGuard` skipped as spikes, and what moved in each, from a run's scalars.

The guard (``skip_spikes``) logs every step ``global/step_skipped`` (1.0 when the
step's update was skipped), ``global/spike_score`` and the running window's mean
and σ of the logarithms of the loss and the gradient norm; for each skipped step its replay logs,
per trainable weight ``<w>``, ``skip_<value>/<w>`` and, where the weight has
enough history, ``skip_z_<value>/<w>`` (``<value>`` in
`kgrad.report.spike_leaders.VALUE_NAMES`). `skipped_steps` reads them back and
ranks each step's weights with `kgrad.report.spike_leaders.rank_skip_leaders`
(ties said as ties, rounding noise not scored).

Example:

>>> import numpy as np
>>> from kgrad.logs.reading import Series
>>> scalars = {"global/step_skipped": Series(np.arange(4), np.array([0.0, 0.0, 1.0, 0.0])),
...            "skip_grad_norm/dense/kernel": Series(np.array([2]), np.array([9.0])),
...            "skip_z_grad_norm/dense/kernel": Series(np.array([2]), np.array([40.0]))}
>>> (skipped,) = skipped_steps(scalars)
>>> skipped.step, skipped.leaders.groups[0][0].layer
(2, 'dense')
"""

import dataclasses
import math

import numpy as np

from kgrad.report.spike_leaders import VALUE_NAMES, rank_skip_leaders

#: 1.0 on a step whose update the guard skipped, 0.0 otherwise.
STEP_SKIPPED_TAG = "global/step_skipped"
#: The step's spike score (the guard's rule).
SPIKE_SCORE_TAG = "global/spike_score"
#: Words for a skipped step whose score is absent: where the guard could not compute it.
NO_SCORE = ("not logged (none is where it cannot be computed: a loss or gradient that is not finite, or a "
            "global gradient norm beyond float32's sums of squares, above ~1.8e19, which spikes)")
#: The window's statistics: ``(field of SkippedStep, tag)``.
WINDOW_TAGS = (
    ("log_loss_mean", "spike_window_mean/log_loss"),
    ("log_loss_std", "spike_window_std/log_loss"),
    ("log_grad_norm_mean", "spike_window_mean/log_grad_norm"),
    ("log_grad_norm_std", "spike_window_std/log_grad_norm"),
)


@dataclasses.dataclass(frozen=True)
class SkippedStep:
    """One skipped step as its logs tell it.

    Attributes:
        step: The step.
        spike_score: ``global/spike_score`` there (NaN if not logged).
        log_loss_mean, log_loss_std, log_grad_norm_mean, log_grad_norm_std: The
            window's statistics of ln loss and ln gradient norm there (NaN where not logged).
        leaders: A `kgrad.report.spike_leaders.SkipLeaders`, or ``None`` when no
            per-weight value was logged for the step (``why`` says so).
        why: Why ``leaders`` is ``None``; ``""`` otherwise.
    """

    step: int
    spike_score: float = math.nan
    log_loss_mean: float = math.nan
    log_loss_std: float = math.nan
    log_grad_norm_mean: float = math.nan
    log_grad_norm_std: float = math.nan
    leaders: object = None
    why: str = ""


def skipped_steps(scalars):
    """The skipped steps of one run, in step order (a tuple of `SkippedStep`; empty without the tag).

    Args:
        scalars: One run's ``scalars`` from `kgrad.read_logs` (tag -> ``Series``).
    """
    flags = scalars.get(STEP_SKIPPED_TAG)
    if flags is None:
        return ()
    steps = sorted({int(step) for step, flag in zip(flags.steps, flags.values) if flag > 0.5})
    values = _per_step(scalars, "skip_")
    z_scores = _per_step(scalars, "skip_z_")
    found = []
    for step in steps:
        fields = {name: _at(scalars.get(tag), step) for name, tag in WINDOW_TAGS}
        step_values, step_z = values.get(step, {}), z_scores.get(step, {})
        if step_values or step_z:
            leaders, why = rank_skip_leaders(step_values, step_z), ""
        else:
            leaders, why = None, "no per-weight values were logged for this step (skip_<value>/ tags)"
        found.append(SkippedStep(step, _at(scalars.get(SPIKE_SCORE_TAG), step), leaders=leaders, why=why,
                                 **fields))
    return tuple(found)


def _per_step(scalars, prefix):
    """``{step: {value name: {weight: value}}}`` of the tags ``<prefix><value name>/<weight>``."""
    by_step = {}
    for tag, series in scalars.items():
        kind, _, weight = tag.partition("/")
        name = kind[len(prefix):] if kind.startswith(prefix) else None
        if name not in VALUE_NAMES or not weight or (prefix == "skip_" and kind.startswith("skip_z_")):
            continue
        for step, value in zip(series.steps.tolist(), series.values.tolist()):
            by_step.setdefault(int(step), {}).setdefault(name, {})[weight] = float(value)
    return by_step


def _at(series, step):
    if series is None:
        return math.nan
    found = np.flatnonzero(np.asarray(series.steps) == step)
    return float(series.values[found[-1]]) if len(found) else math.nan


def describe(skipped, named=3):
    """Lines for ``kgrad report``: each skipped step, its score, and the layers that moved most.

    Returns ``[]`` when no step was skipped.

    >>> describe([SkippedStep(7, 9.5, why="no per-weight values were logged")])
    ['skipped steps (the guard did not apply their update): 1', '  step 7: spike score 9.5; no per-weight values were logged']
    """
    if not skipped:
        return []
    lines = [f"skipped steps (the guard did not apply their update): {len(skipped)}"]
    for step in skipped:
        score = _number(step.spike_score) if not math.isnan(step.spike_score) else NO_SCORE
        head = f"  step {step.step}: spike score {score}"
        if not math.isnan(step.log_loss_mean):
            head += f" (ln loss window {_number(step.log_loss_mean)} ± {_number(step.log_loss_std)})"
        if step.leaders is None:
            lines.append(f"{head}; {step.why}")
            continue
        words = dataclasses.replace(step.leaders, named=named).describe().split("\n")
        lines.append(f"{head}; {words[0]}")
        lines += [f"    {line}" for line in words[1:]]
    return lines


def _number(value):
    return f"{value:.3g}" if not math.isnan(value) else "not logged"
