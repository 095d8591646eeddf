"""Gradient health per layer, computed from the logs a `GradientProbe` wrote.

Pure functions over what `kgrad.read_logs` returns: `health_report` turns
logs into `RunHealth` values (`kgrad.report.table` turns those into text).
Nothing here reads files or prints, so notebooks and CI scripts can use the
numbers directly.

A layer's *gradient norm* is the L2 norm of dJ/dw over all of its weights
(what the optimizer gets), or, when weight gradients were not captured, of
dJ/d(layer output). Flags:

- ``vanishing``: the latest gradient norm is exactly 0 (no gradient reaches
  the layer: also when no layer of the run gets one, as behind a dead layer),
  or below ``vanishing_ratio`` times the largest layer's latest gradient norm
  in the same run. Layers whose weights are all vectors (a normalization
  layer's gamma and beta) are set only beside each other: their norms, over a
  few hundred numbers, are not comparable with a kernel's over millions.
- ``exploding``: the latest gradient norm is above ``exploding_norm``.
- ``dead``: at least ``dead_fraction`` of the layer's latest activations are
  exactly zero (e.g. ReLUs that never fire).
- ``nonfinite``: a NaN or Inf was counted in the layer's activations or
  gradients, or its gradient norm was NaN or Inf, on any probed step.
"""

import dataclasses
import math

import numpy as np

from kgrad.report import layer_series, noise_scale, skipped_steps, stability
from kgrad.report.flags import (  # noqa: F401 (FLAGS: the report's flags, read by the table and the tab)
    FLAGS,
    first_flag_steps,
    largest_norm_by_step,
    last,
    layer_flags,
    nonfinite_count,
    nonfinite_norms,
    trend,
)

#: Tag prefixes that mark a run as written by kgrad.
_KGRAD_PREFIXES = ("grad_norm/", "weight_grad_norm/", "global/grad_norm", skipped_steps.STEP_SKIPPED_TAG)


@dataclasses.dataclass(frozen=True)
class HealthThresholds:
    """When `health_report` flags a layer (see the module docstring).

    Args:
        vanishing_ratio: Flag a layer whose gradient norm is below this
            fraction of the largest layer's (a float in ``(0, 1)``); a
            norm of exactly 0 is flagged whatever the largest is.
        exploding_norm: Flag a layer whose gradient norm is above this
            (a positive float).
        dead_fraction: Flag a layer with at least this fraction of zero
            activations (a float in ``(0, 1]``).

    Example:

    >>> import kgrad
    >>> strict = kgrad.HealthThresholds(vanishing_ratio=1e-2)
    >>> strict.describe().split(";")[0]
    "vanishing: the layer's gradient norm 0 or < 0.01 x the largest layer's"
    """

    vanishing_ratio: float = 1e-3
    exploding_norm: float = 1e3
    dead_fraction: float = 0.99

    def __post_init__(self):
        _check_range("vanishing_ratio", self.vanishing_ratio, 0.0, 1.0, "1e-3")
        _check_range("exploding_norm", self.exploding_norm, 0.0, math.inf, "1e3")
        _check_range("dead_fraction", self.dead_fraction, 0.0, 1.0, "0.99", high_ok=True)

    def describe(self):
        """One line naming every threshold, as printed by ``kgrad report``."""
        return (
            f"vanishing: the layer's gradient norm 0 or < {self.vanishing_ratio:g} x the largest layer's; "
            f"exploding: gradient norm > {self.exploding_norm:g}; "
            f"dead: >= {self.dead_fraction:.0%} zero activations; "
            "nonfinite: any NaN/Inf"
        )


def _check_range(argument, value, low, high, example, high_ok=False):
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    inside = is_number and low < value and (value <= high if high_ok else value < high)
    if not inside:
        bracket = "]" if high_ok else ")"
        raise ValueError(
            f"`{argument}` must be a number in ({low:g}, {high:g}{bracket}. "
            f"Received: {argument}={value!r}. Example: {argument}={example}."
        )


@dataclasses.dataclass(frozen=True)
class LayerHealth:
    """Gradient health of one layer (NaN where a quantity was not logged).

    Attributes:
        layer: The layer name used in the tags (``grad_norm/<layer>``).
        grad_norm: Gradient norm at the last probed step (NaN or Inf when
            that norm was: then ``nonfinite_norms`` > 0).
        trend: Geometric mean of the gradient norm over the last third of the
            probes divided by the one over the first third (NaN for < 2 probes
            or when both are 0; ``inf`` when the norm grew from exactly 0).
        ratio_to_max: ``grad_norm`` over the largest ``grad_norm`` in the run
            (of a layer whose weights are all vectors: the largest of such layers).
        zero_fraction: Fraction of exactly-zero activations, last probe.
        update_ratio: ‖Δw‖ / ‖w‖ over the layer's logged weights (kernels by default), last probe.
        nonfinite: NaN/Inf values counted over all probes and tensors
            (the counts logged: ``statistics="default"`` counts those of
            dJ/d(layer output), not those of dJ/dw).
        nonfinite_norms: Probed steps on which the gradient norm was NaN or
            Inf (it is when any element is, counted or not).
        flags: The raised flags, a subset of `FLAGS` in that order.
        first_flagged: ``(flag, step)`` for each raised flag: the first probed
            step at which that flag held on that step's values (the flags
            themselves use the latest values; see `first_flag_steps`).
    """

    layer: str
    grad_norm: float
    trend: float
    ratio_to_max: float
    zero_fraction: float
    update_ratio: float
    nonfinite: int
    flags: tuple
    first_flagged: tuple = ()
    nonfinite_norms: int = 0


@dataclasses.dataclass(frozen=True)
class RunHealth:
    """Gradient health of every layer of one run.

    Attributes:
        run: The run name, as in `kgrad.read_logs` and TensorBoard.
        gradient: What ``grad_norm`` measures: ``"dJ/dw"`` or ``"dJ/d(output)"``.
        steps: The probed steps, an int64 array.
        layers: `LayerHealth` per layer, in the order the probe logged them.
        critical_batch: The smoothed gradient noise scale beside the batch size
            in use (`kgrad.report.noise_scale.CriticalBatch`), or ``None``
            when the run holds no per-example (``noise_*``) tags.
        vector_only_layers: The layers whose weights are all vectors
            (normalization layers), whose ``ratio_to_max`` is against the
            largest of them.
        stability: Spikes of the loss, the global gradient norm, ``adam_rms/``
            and ``logit_max_max/``, and what spiked before each loss spike
            (`kgrad.report.stability.StabilityReport`), or ``None``.
        skipped: The steps a `kgrad.NonFiniteGuard` skipped as spikes, with the
            layers that moved most in each (`kgrad.report.skipped_steps.SkippedStep`).
    """

    run: str
    gradient: str
    steps: np.ndarray
    layers: tuple
    critical_batch: object = None
    vector_only_layers: tuple = ()
    stability: object = None
    skipped: tuple = ()

    @property
    def comparison(self):
        """What ``/ largest`` is set beside, in words, for table captions.

        >>> import numpy as np
        >>> run = RunHealth("kgrad", "dJ/dw", np.array([0]), (), vector_only_layers=("bn",))
        >>> print(run.comparison.replace("; ", "\\n"))
        / largest: beside the run's largest
        of the 1 layer with only vector weights (normalization), beside the largest of those
        """
        if not self.vector_only_layers:
            return "/ largest: beside the run's largest"
        count = len(self.vector_only_layers)
        return (
            f"/ largest: beside the run's largest; of the {count} layer{'s' if count > 1 else ''} with only "
            "vector weights (normalization), beside the largest of those"
        )

    @property
    def flagged(self):
        """The layers with at least one flag."""
        return tuple(layer for layer in self.layers if layer.flags)


def health_report(logs, thresholds=None):
    """Gradient health of every kgrad run in ``logs``.

    Args:
        logs: What `kgrad.read_logs` returns.
        thresholds: A `HealthThresholds`; ``None`` uses the defaults.

    Returns:
        A list of `RunHealth`, one per run that holds kgrad gradient tags, in
        run order; empty when there is none (e.g. only Keras' ``train`` run).

    Example:

    >>> import kgrad, numpy as np
    >>> from kgrad.logs.reading import Series
    >>> steps = np.array([0, 10])
    >>> logs = {"kgrad": {"histograms": {}, "scalars": {
    ...     "grad_norm/early": Series(steps, np.array([1e-4, 1e-6])),
    ...     "grad_norm/late": Series(steps, np.array([0.5, 0.4]))}}}
    >>> [(layer.layer, layer.flags) for layer in kgrad.health_report(logs)[0].layers]
    [('early', ('vanishing',)), ('late', ())]
    """
    thresholds = HealthThresholds() if thresholds is None else thresholds
    if not isinstance(thresholds, HealthThresholds):
        raise TypeError(
            f"`thresholds` must be a kgrad.HealthThresholds or None. Received: thresholds={thresholds!r}."
        )
    return [run_health(run, run_logs, thresholds) for run, run_logs in logs.items() if is_kgrad_run(run_logs)]


def is_kgrad_run(run_logs):
    """Whether a run of `kgrad.read_logs` holds gradient norms written by kgrad."""
    return any(tag.startswith(_KGRAD_PREFIXES) for tag in run_logs["scalars"])


def run_health(run, run_logs, thresholds):
    """The `RunHealth` of one run of `kgrad.read_logs` output."""
    scalars = run_logs["scalars"]
    layers = layer_series.layer_weights(scalars)
    use_weights = any(layers.values())
    gradients = {
        layer: layer_series.combined_norm(scalars, "weight_grad_norm", weights)
        if use_weights
        else layer_series.series(scalars, f"grad_norm/{layer}")
        for layer, weights in layers.items()
    }
    latest = {layer: last(series) for layer, series in gradients.items()}
    peers = _peer_groups(layers, run_logs.get("weight_shapes") or {}) if use_weights else {}
    largest, largest_by_step = {}, {}
    for group in set(peers.values()) | {None}:
        members = {layer: gradients[layer] for layer in layers if peers.get(layer) == group}
        finite = [latest[layer] for layer in members if math.isfinite(latest[layer])]
        largest[group] = max(finite, default=math.nan)
        largest_by_step[group] = largest_norm_by_step(members)
    rows = []
    for layer, weights in layers.items():
        top = largest[peers.get(layer)]
        row = LayerHealth(
            layer=layer,
            grad_norm=latest[layer],
            trend=trend(gradients[layer]),
            ratio_to_max=latest[layer] / top if top > 0 else math.nan,
            zero_fraction=last(layer_series.series(scalars, f"activation_zero_fraction/{layer}")),
            update_ratio=last(layer_series.update_ratio(scalars, weights)),
            nonfinite=nonfinite_count(scalars, layer, weights),
            flags=(),
            nonfinite_norms=nonfinite_norms(gradients[layer]),
        )
        flags = layer_flags(row, thresholds)
        first = first_flag_steps(
            scalars, layer, weights, gradients, thresholds, largest_by_step[peers.get(layer)]
        )
        first_flagged = tuple((flag, first[flag]) for flag in flags if flag in first)
        rows.append(dataclasses.replace(row, flags=flags, first_flagged=first_flagged))
    steps = next((s.steps for s in gradients.values() if s is not None), np.zeros([0], np.int64))
    return RunHealth(
        run, "dJ/dw" if use_weights else "dJ/d(output)", steps, tuple(rows),
        critical_batch=noise_scale.critical_batch(scalars),
        vector_only_layers=tuple(layer for layer in layers if layer in peers),
        stability=stability.stability_report(scalars),
        skipped=skipped_steps.skipped_steps(scalars),
    )


def _peer_groups(layers, shapes):
    """Layer -> ``"no matrix"`` for the layers whose dJ/dw norm is compared among themselves.

    A layer whose weights are all known to have fewer than two dimensions (a
    BatchNormalization's gamma and beta: hundreds of numbers) has a gradient
    norm that cannot be set beside a kernel's (millions): its ``/ largest``
    is against the largest such layer. Without shapes (logs of other writers,
    or of kgrad before it logged them) every layer is in one group.
    """
    return {
        layer: "no matrix"
        for layer, weights in layers.items()
        if weights and all(weight in shapes and len(shapes[weight]) < 2 for weight in weights)
    }
