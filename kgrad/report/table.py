"""The text of ``kgrad report``: one gradient-health table per run.

Formats the `kgrad.report.health.RunHealth` values computed by `kgrad.health_report`;
computes nothing itself.
"""

import math
import os

from kgrad.report import noise_scale, skipped_steps, stability

_COLUMNS = ("layer", "{gradient}", "trend", "/ largest", "zero act", "update/w", "NaN/Inf", "flags")

#: The one name of each gradient, in every text kgrad prints, and its tags:
#: dJ/dw is the "weight grad" (``weight_grad_norm/``), dJ/d(layer output) the
#: "activation grad" (``grad_norm/``, a tag name kept from kgrad's first logs).
GRADIENT_NAMES = {"dJ/dw": "weight grad", "dJ/d(output)": "activation grad"}
_GRADIENT_MEANINGS = {
    "dJ/dw": "L2 norm of dJ/dw over the layer's logged weights (weight_grad_norm/)",
    "dJ/d(output)": "L2 norm of dJ/d(layer output) (grad_norm/)",
}


def format_run(run):
    """One run's `RunHealth` as a text table, headed by the run and its steps.

    Example:

    >>> import numpy as np
    >>> from kgrad.report.health import LayerHealth, RunHealth
    >>> from kgrad.report.table import format_run
    >>> row = LayerHealth("dense", 0.5, 0.8, 1.0, 0.25, 1e-3, 0, ())
    >>> print(format_run(RunHealth("kgrad", "dJ/dw", np.array([0, 10]), (row,))))  # doctest: +ELLIPSIS
    run 'kgrad': 2 probes, steps 0..10; weight grad = L2 norm of dJ/dw over ... (weight_grad_norm/)
    layer  weight grad  trend  / largest  zero act  update/w  NaN/Inf  flags
    dense  5.0e-01      x0.80  1.0e+00    0.25      1.0e-03   0        ok
    """
    name = GRADIENT_NAMES[run.gradient]
    span = f"steps {run.steps[0]}..{run.steps[-1]}" if len(run.steps) else "no steps"
    meaning = _GRADIENT_MEANINGS[run.gradient]
    header = f"run {run.run!r}: {len(run.steps)} probes, {span}; {name} = {meaning}"
    if run.vector_only_layers:
        header += f"; {run.comparison}"
    columns = tuple(column.format(gradient=name) for column in _COLUMNS)
    cells = [columns] + [
        (
            layer.layer,
            _number(layer.grad_norm, ".1e", logged=layer.nonfinite_norms > 0),
            _trend_cell(layer.trend),
            _number(layer.ratio_to_max, ".1e"),
            _number(layer.zero_fraction, ".2f"),
            _number(layer.update_ratio, ".1e"),
            nonfinite_cell(layer.nonfinite, layer.nonfinite_norms),
            " ".join(flag.upper() for flag in layer.flags) or "ok",
        )
        for layer in run.layers
    ]
    widths = [max(len(row[column]) for row in cells) for column in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    if getattr(run, "critical_batch", None) is not None:  # per-example instruments were on
        lines.append(noise_scale.describe(run.critical_batch))
    lines += stability.describe(getattr(run, "stability", None))
    lines += skipped_steps.describe(getattr(run, "skipped", ()))
    return "\n".join([header] + lines)


def format_report(runs, thresholds):
    """The full ``kgrad report`` text: thresholds, one table per run, a verdict."""
    parts = [f"Thresholds: {thresholds.describe()}"]
    parts += [format_run(run) for run in runs]
    flagged = [run for run in runs if run.flagged]
    if flagged:
        problems = "; ".join(f"{run.run}: {_problems(run.flagged)}" for run in flagged)
        parts.append(f"PROBLEMS in {len(flagged)} of {len(runs)} runs. {problems}")
    else:
        verdict = f"no layer flagged in {len(runs)} run{'s' if len(runs) != 1 else ''}"
        # Not "OK" right under a loss spike: the spike is what the stability lines above are about.
        spikes = sum(len(getattr(getattr(run, "stability", None), "loss_spikes", ())) for run in runs)
        if spikes:
            verdict += f"; {spikes} loss spike{'s' if spikes != 1 else ''} (stability, above)"
        skipped = sum(len(getattr(run, "skipped", ())) for run in runs)
        if skipped:
            verdict += f"; {skipped} step{'s' if skipped != 1 else ''} skipped by the guard (above)"
        calm = not spikes and not skipped
        parts.append(f"OK: {verdict}." if calm else f"{verdict[0].upper()}{verdict[1:]}.")
    return "\n\n".join(parts)


def _problems(layers, named=6, shown=3):
    """The flagged layers of a run: each by name, or, beyond ``named``, counted per flag.

    A ResNet whose gradients explode flags ~50 layers; the verdict stays one
    readable line, and the table above it has every layer.

    Example:

    >>> from kgrad.report.health import LayerHealth
    >>> from kgrad.report.table import _problems
    >>> layers = [LayerHealth(f"conv{i}", 2e3, 1.0, 1.0, 0.0, 1e-3, 0, ("exploding",)) for i in range(8)]
    >>> _problems(layers)
    '8 layers exploding (conv0, conv1, conv2 and 5 more)'
    >>> _problems(layers[:2])
    'conv0 (exploding), conv1 (exploding)'
    """
    if len(layers) <= named:
        return ", ".join(f"{layer.layer} ({' '.join(layer.flags)})" for layer in layers)
    groups = {}
    for layer in layers:
        groups.setdefault(" ".join(layer.flags), []).append(layer.layer)
    parts = []
    for flags, names in groups.items():
        listed = ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
        parts.append(f"{len(names)} layer{'s' if len(names) != 1 else ''} {flags} ({listed})")
    return ", ".join(parts)


def nonfinite_cell(nonfinite, nonfinite_norms):
    """The NaN/Inf cell of a layer: its count, or, when none was counted, its NaN/Inf norms.

    ``statistics="default"`` logs dJ/dw's norm but not its NaN/Inf count: a
    norm that was NaN/Inf is said, not shown as a count of 0.

    Args:
        nonfinite: `kgrad.report.health.LayerHealth.nonfinite`.
        nonfinite_norms: `kgrad.report.health.LayerHealth.nonfinite_norms`.

    Example:

    >>> from kgrad.report.table import nonfinite_cell
    >>> nonfinite_cell(12, 1), nonfinite_cell(0, 2), nonfinite_cell(0, 0)
    ('12', 'norm (2 steps)', '0')
    """
    if nonfinite == 0 and nonfinite_norms > 0:
        return f"norm ({nonfinite_norms} step{'s' if nonfinite_norms != 1 else ''})"
    return str(nonfinite)


def _number(value, spec, logged=False):
    # NaN is "not logged" unless the norm was logged as NaN.
    return "nan" if logged and math.isnan(value) else "-" if math.isnan(value) else format(value, spec)


def _trend_cell(trend):
    if math.isnan(trend):
        return "-"
    if math.isinf(trend):
        return "from 0"
    return f"x{trend:.2f}" if 0.01 <= trend < 1000 else f"x{trend:.1e}"


def named_runs(logs, log_dir):
    """``logs`` with the run ``"."`` (event files right in ``log_dir``) named by the folder.

    `read_logs` names such a run ``"."``, as TensorBoard does; in a report it
    reads better as ``"run1"`` for ``kgrad report logs/run1``. ``logs`` is any
    dict keyed by run.

    >>> named_runs({".": 1}, "logs/run1"), named_runs({"a": 1, "b": 2}, "logs")
    ({'run1': 1}, {'a': 1, 'b': 2})
    """
    name = os.path.basename(os.path.abspath(log_dir)) or "."
    if "." not in logs or name in logs:
        return logs
    return {name if run == "." else run: run_logs for run, run_logs in logs.items()}
