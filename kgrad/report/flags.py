"""Which flags a layer raises (nonfinite, exploding, vanishing, dead), and since which step.

Pure functions of the series `kgrad.logs.read_logs` returns; `kgrad.report.health`
puts them together per run.
"""

import math

import numpy as np

from kgrad.report import layer_series

#: The flags `layer_flags` can raise, in the order they are shown.
FLAGS = ("nonfinite", "exploding", "vanishing", "dead")


def layer_flags(row, thresholds):
    """The flags of one `LayerHealth` under ``thresholds``, in `FLAGS` order."""
    raised = {
        "nonfinite": row.nonfinite > 0 or row.nonfinite_norms > 0,
        "exploding": row.grad_norm > thresholds.exploding_norm,
        # 0 / 0 has no ratio, but a layer that gets no gradient at all has vanished
        # gradients even when no other layer gets one either.
        "vanishing": row.grad_norm == 0 or row.ratio_to_max < thresholds.vanishing_ratio,
        "dead": row.zero_fraction >= thresholds.dead_fraction,
    }
    return tuple(flag for flag in FLAGS if raised[flag])


def first_flag_steps(scalars, layer, weights, gradients, thresholds, largest_by_step=None):
    """The first probed step at which each flag held for ``layer``.

    Each step is judged on its own values, as `layer_flags` judges the latest
    ones: ``vanishing`` holds where the layer's gradient norm is 0 or small
    beside the largest layer's on the same step; ``nonfinite`` holds from the first step that
    counted a NaN/Inf.

    Args:
        scalars: The run's ``"scalars"`` from `kgrad.read_logs`.
        layer: The layer name.
        weights: The layer's weight paths.
        gradients: Layer name -> gradient-norm `Series` (or ``None``), every layer.
        thresholds: A `HealthThresholds`.
        largest_by_step: Step -> the largest finite gradient norm on that step,
            computed from ``gradients`` when ``None`` (pass it for many layers).

    Returns:
        ``dict`` flag -> first step (an ``int``); flags that never held are absent.
    """
    held = {flag: [] for flag in FLAGS}  # flag -> steps at which it held
    own = gradients.get(layer)
    largest = largest_norm_by_step(gradients) if largest_by_step is None else largest_by_step
    for step, norm in zip(*((own.steps.tolist(), own.values.tolist()) if own is not None else ((), ()))):
        top = largest.get(step, 0.0)
        if norm == 0 or (top > 0 and norm / top < thresholds.vanishing_ratio):
            held["vanishing"].append(step)
        if norm > thresholds.exploding_norm:
            held["exploding"].append(step)
        if not math.isfinite(norm):  # a logged NaN/Inf norm (not logged steps are absent)
            held["nonfinite"].append(step)
    zero = layer_series.series(scalars, f"activation_zero_fraction/{layer}")
    if zero is not None:
        held["dead"] = zero.steps[zero.values >= thresholds.dead_fraction].tolist()
    tags = [f"{kind}_nonfinite/{layer}" for kind in ("activation", "grad")]
    tags += [f"weight_grad_nonfinite/{w}" for w in weights]
    for tag in (tag for tag in tags if tag in scalars):
        held["nonfinite"].extend(scalars[tag].steps[scalars[tag].values > 0].tolist())
    return {flag: int(min(steps)) for flag, steps in held.items() if steps}


def largest_norm_by_step(gradients):
    """Step -> the largest finite gradient norm of any layer on that step."""
    largest = {}
    for series in gradients.values():
        if series is not None:
            for step, norm in zip(series.steps.tolist(), series.values.tolist()):
                if math.isfinite(norm):
                    largest[step] = max(largest.get(step, 0.0), norm)
    return largest


def last(series):
    if series is None or len(series.values) == 0:
        return math.nan
    return float(series.values[-1])


def trend(series):
    if series is None or len(series.values) < 2:
        return math.nan
    third = max(1, len(series.values) // 3)

    def geometric_mean(values):
        # A norm of exactly 0 (a layer behind a zero-initialized one, at step 0)
        # makes the mean 0: a trend from 0 is infinite, not 1e308 from a floor.
        if np.any(values == 0):
            return 0.0
        return float(np.exp(np.mean(np.log(values))))

    first, last = geometric_mean(series.values[:third]), geometric_mean(series.values[-third:])
    if first == 0:
        return math.inf if last > 0 else math.nan
    return last / first


def nonfinite_norms(series):
    return 0 if series is None else int(np.sum(~np.isfinite(series.values)))


def nonfinite_count(scalars, layer, weights):
    tags = [f"{kind}_nonfinite/{layer}" for kind in ("activation", "grad")]
    tags += [f"weight_grad_nonfinite/{w}" for w in weights]
    return int(sum(np.sum(scalars[tag].values) for tag in tags if tag in scalars))
