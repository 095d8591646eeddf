"""``kgrad report --json``: the report as data, for CI scripts and notebooks.

What the table says, with the same rules: per run its layers' health, its
spikes and, for each loss spike, what spiked first as *ties* (the signals of
one probe in one group, each with its size in σ: never an order), the signals
not scored (rounding noise, and why), and the steps a `kgrad.NonFiniteGuard`
skipped with their leading layers (groups of values whose z-scores cannot be
told apart, largest first). A NaN or infinite number is the string ``"NaN"``,
``"Inf"`` or ``"-Inf"`` (JSON has no such numbers; never a zero or a guess).

Example:

>>> import json, kgrad, numpy as np
>>> from kgrad.logs.reading import Series
>>> steps = np.array([0, 10])
>>> logs = {"kgrad": {"histograms": {}, "scalars": {"grad_norm/dense": Series(steps, np.array([0.5, 0.4]))}}}
>>> data = report_data(kgrad.health_report(logs), kgrad.HealthThresholds())
>>> data["runs"][0]["layers"][0]["layer"], json.loads(json.dumps(data))["flagged_runs"]
('dense', 0)
"""

import dataclasses
import math

from kgrad.report.stability import spike_size
from kgrad.report.stability_words import ties


def report_data(runs, thresholds):
    """A JSON-ready ``dict`` of ``kgrad report``: ``{"thresholds", "runs", "flagged_runs"}``.

    Args:
        runs: `kgrad.health_report`'s list of `RunHealth`.
        thresholds: The `HealthThresholds` they were judged by.
    """
    return {
        "thresholds": _clean(dataclasses.asdict(thresholds)),
        "runs": [_run(run) for run in runs],
        "flagged_runs": sum(1 for run in runs if run.flagged),
    }


def _run(run):
    layers = [
        {"layer": layer.layer, "grad_norm": layer.grad_norm, "trend": layer.trend,
         "ratio_to_max": layer.ratio_to_max, "zero_fraction": layer.zero_fraction,
         "update_ratio": layer.update_ratio, "nonfinite": layer.nonfinite, "flags": list(layer.flags),
         "first_flagged": dict(layer.first_flagged)}
        for layer in run.layers
    ]
    return _clean({
        "run": run.run,
        "gradient": run.gradient,
        "probes": len(run.steps),
        "layers": layers,
        "stability": _stability(run.stability),
        "skipped_steps": [_skipped(step) for step in run.skipped],
    })


def _stability(report):
    if report is None:
        return None
    return {
        "rule": {"sigmas": report.sigmas, "history": report.history, "window": report.window},
        "loss_spikes": [
            {"step": spike.step, "value": spike.value, "mean": spike.mean, "std": spike.std,
             "first": [_tie(tie) for tie in ties(spike.leaders)]}
            for spike in report.loss_spikes
        ],
        "spikes": {
            tag: [{"step": spike.step, "value": spike.value, "sigmas": spike_size(spike)} for spike in found]
            for tag, found in report.spikes.items()
        },
        "not_scored": [{"tag": tag, "reason": reason} for tag, reason in report.not_scored],
    }


def _tie(tie):
    """One probe's leaders: a tie, its size, each signal with its σ (largest first)."""
    return {
        "step": tie[0].step,
        "probes_ahead": tie[0].probes_ahead,
        "at_once": len(tie),
        "signals": [{"layer": lead.layer, "signal": lead.signal, "tag": lead.tag, "sigmas": lead.sigmas}
                    for lead in tie],
    }


def _skipped(step):
    fields = {"step": step.step, "spike_score": step.spike_score,
              "window": {"log_loss_mean": step.log_loss_mean, "log_loss_std": step.log_loss_std,
                         "log_grad_norm_mean": step.log_grad_norm_mean,
                         "log_grad_norm_std": step.log_grad_norm_std}}
    if step.leaders is None:
        return {**fields, "leaders": None, "why": step.why}
    return {
        **fields,
        # Groups whose sizes cannot be told apart: a tie, never an order.
        "leaders": [[entry._asdict() for entry in group] for group in step.leaders.groups],
        "layers": [[{"layer": entry.layer, "value_name": entry.value_name, "z": entry.z} for entry in group]
                   for group in step.leaders.layers()],
        "not_scored": [{"weight": weight, "reason": reason} for weight, reason in step.leaders.not_scored],
        "words": step.leaders.describe(),
    }


def _clean(value):
    """``value`` with NaN and ±infinity as strings, tuples as lists, NumPy numbers as Python's."""
    if isinstance(value, dict):
        return {str(key): _clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(item) for item in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Inf" if value > 0 else "-Inf")
    return value
