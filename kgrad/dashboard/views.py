"""What the kgrad tab and the HTML report draw, as compact JSON-ready dicts.

Pure functions of one run's data (`kgrad.dashboard.events.read_run`, which
has the shape of a run of `kgrad.read_logs`): the layer x step matrix of a
quantity, the health table with the step each flag first held, the NaN/Inf
timeline and the guard's report, and one tag's histograms over steps.
Matrices travel as base64 float32 (row-major), not one JSON object per
point: 200 layers x 10 000 steps are 8 MB before gzip.
"""

import base64
import math

import numpy as np

from kgrad.report import layer_series, health as report
from kgrad.report.table import GRADIENT_NAMES
from kgrad.dashboard import stability_view
from kgrad.dashboard.events import NONFINITE_MARK, guard_reports
from kgrad.dashboard.histogram_ranges import histogram_kind, shared_range
from kgrad.logs.reading import Series
from kgrad.plan.histogram_buckets import MAGNITUDE_EDGES

#: Heatmap quantities: key -> (label, unit, colour scale, histogram prefix).
QUANTITIES = {
    "weight_grad": ("dJ/dw norm", "‖dJ/dw‖ over the layer's weights", "log", "weight_grad_hist/"),
    "grad": ("dJ/d(activation) norm", "‖dJ/d(layer output)‖", "log", "grad_hist/"),
    "update_ratio": ("update ratio", "‖Δw‖ / ‖w‖", "log", "weight_grad_hist/"),
    "zero_fraction": (
        "zero activations",
        "fraction of exactly-zero activations",
        "linear",
        "activation_hist/",
    ),
}


def encode_floats(values):
    """A float array as base64 of its little-endian float32 bytes (NaN kept)."""
    return base64.b64encode(np.ascontiguousarray(values, "<f4").tobytes()).decode("ascii")


def clean(value):
    """``value`` with NaN/Inf floats as ``None``, so that JSON stays standard."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(item) for item in value]
    return value


class RunView:
    """The dashboard's views of one run, each computed once.

    Args:
        run: The run name.
        data: The run's data (`kgrad.dashboard.events.read_run`).
        thresholds: The `kgrad.HealthThresholds` of the flags.
    """

    def __init__(self, run, data, thresholds=None):
        self.run = run
        self.data = data
        self.thresholds = thresholds or report.HealthThresholds()
        self._memo = {}

    def _once(self, key, compute):
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def health(self):
        """The run's `kgrad.report.health.RunHealth`."""
        return self._once("health", lambda: report.run_health(self.run, self.data, self.thresholds))

    @property
    def layers(self):
        """Layer name -> its weight paths, in forward order (as ``kgrad report``)."""
        return self._once("layers", lambda: layer_series.layer_weights(self.data["scalars"]))

    def heatmap(self, quantity):
        """The layer x step matrix of ``quantity`` (a key of `QUANTITIES`)."""
        return self._once(("heatmap", quantity), lambda: self._heatmap(quantity))

    def _heatmap(self, quantity):
        label, unit, scale, hist_prefix = QUANTITIES[quantity]
        scalars = self.data["scalars"]
        rows = [self._row(quantity, layer, weights) for layer, weights in self.layers.items()]
        steps = np.unique(np.concatenate([s.steps for s in rows if s is not None] or [np.zeros(0, np.int64)]))
        matrix = np.full([len(rows), len(steps)], np.nan, np.float32)
        for index, series in enumerate(rows):
            if series is not None and len(series.steps):
                # NaN stays "not logged"; a logged NaN is shown as the non-finite value it is.
                matrix[index, np.searchsorted(steps, series.steps)] = np.where(
                    np.isnan(series.values), np.inf, series.values
                )
        finite = matrix[np.isfinite(matrix) & ((matrix > 0) if scale == "log" else True)]
        flags = {row.layer: row for row in self.health.layers}
        return {
            "run": self.run,
            "quantity": quantity,
            "label": label,
            "unit": unit,
            "scale": scale,
            "layers": list(self.layers),
            "flags": [list(flags[name].flags) if name in flags else [] for name in self.layers],
            "histogram_tags": [
                self._present_histograms(hist_prefix, layer, weights)
                for layer, weights in self.layers.items()
            ],
            "steps": steps.tolist(),
            "values": encode_floats(matrix),
            "min": float(finite.min()) if finite.size else None,
            "max": float(finite.max()) if finite.size else None,
            "has_scalars": any(tag.startswith("grad_norm/") for tag in scalars),
        }

    def _row(self, quantity, layer, weights):
        scalars = self.data["scalars"]
        if quantity == "weight_grad":
            return layer_series.combined_norm(scalars, "weight_grad_norm", weights)
        if quantity == "grad":
            return layer_series.series(scalars, f"grad_norm/{layer}")
        if quantity == "zero_fraction":
            return layer_series.series(scalars, f"activation_zero_fraction/{layer}")
        ratios = layer_series.update_ratio(scalars, weights)
        if ratios is None:
            return None
        # NaN: the logs do not hold this step's ratio; the cell shows "not logged"
        # (a logged NaN/Inf ratio is inf, shown as NaN/Inf).
        known = ~np.isnan(ratios.values)
        return Series(ratios.steps[known], ratios.values[known])

    def _present_histograms(self, prefix, layer, weights):
        """The row's histogram tags for a quantity, else its dJ/d(activation) or activation ones."""
        wanted = (
            [prefix + weight for weight in weights] if prefix == "weight_grad_hist/" else [prefix + layer]
        )
        for tags in (wanted, [f"grad_hist/{layer}"], [f"activation_hist/{layer}"]):
            present = [tag for tag in tags if tag in self.data["histograms"]]
            if present:
                return present
        return []

    def summary(self):
        """Health table, NaN/Inf timeline and guard reports of the run."""
        return self._once("summary", self._summary)

    def _summary(self):
        health = self.health
        steps = health.steps
        return clean(
            {
                "run": self.run,
                "gradient": health.gradient,
                # The column's one name, as `kgrad report` prints it ("weight grad").
                "gradient_name": GRADIENT_NAMES[health.gradient],
                "comparison": health.comparison if health.vector_only_layers else None,
                "probes": int(len(steps)),
                "first_step": int(steps[0]) if len(steps) else None,
                "last_step": int(steps[-1]) if len(steps) else None,
                "thresholds": self.thresholds.describe(),
                "health": [_health_row(row) for row in health.layers],
                "nonfinite": nonfinite_timeline(self.data["scalars"], self.layers),
                "guard": guard_reports(self.data),
            }
        )

    def stability(self):
        """The stability view: adam_rms, max logits, attention maxima, spikes (`stability_view`)."""
        return self._once("stability", lambda: clean(stability_view.stability_view(
            self.run, self.data["scalars"], self.data.get("weight_shapes", {}), self.health.stability,
            self.health.skipped)))

    def histogram(self, tag):
        """One histogram tag over steps, its kind (``"log"``, ``"linear"``) and the x-range of its kind."""
        return self._once(("histogram", tag), lambda: self._histogram(tag))

    def _histogram(self, tag):
        series = self.data["histograms"][tag]
        values = series.values
        if isinstance(values, list):  # bucket count changed between steps: pad with empty buckets
            width = max(array.shape[0] for array in values)
            values = np.stack([np.pad(a, [(0, width - a.shape[0]), (0, 0)], mode="edge") for a in values])
            for index, array in enumerate(series.values):
                values[index, array.shape[0] :, 2] = 0
        prefix = tag.partition("/")[0] + "/"
        kind = histogram_kind(values)
        # The fixed edges' ends: the outermost buckets also hold every magnitude beyond them.
        outermost = [float(MAGNITUDE_EDGES[0]), float(MAGNITUDE_EDGES[-1])] if kind == "log" else None
        return {
            "run": self.run,
            "tag": tag,
            "steps": series.steps.tolist(),
            "buckets": int(values.shape[1]) if values.ndim == 3 else 0,
            "values": encode_floats(values),
            "kind": kind,
            "range": self._once(
                ("range", prefix, kind), lambda: shared_range(self.data["histograms"], prefix, kind)
            ),
            "outermost": outermost,
        }


def _health_row(row):
    grad_norm = row.grad_norm
    if row.nonfinite_norms and not math.isfinite(grad_norm):
        # Logged so (JSON has no NaN/Inf; `clean` would make it "not logged").
        grad_norm = "NaN" if math.isnan(grad_norm) else "Inf" if grad_norm > 0 else "-Inf"
    return {
        "layer": row.layer,
        "grad_norm": grad_norm,
        # JSON has no Inf: a norm that grew from exactly 0 is said so.
        "trend": "from 0" if math.isinf(row.trend) else row.trend,
        "ratio_to_max": row.ratio_to_max,
        "zero_fraction": row.zero_fraction,
        "update_ratio": row.update_ratio,
        "nonfinite": row.nonfinite,
        "nonfinite_norms": row.nonfinite_norms,
        "flags": list(row.flags),
        "first_flagged": {flag: step for flag, step in row.first_flagged},
    }


#: Steps with NaN/Inf sent per tag (the first ones); ``bad_steps`` counts them all.
MAX_TIMELINE_STEPS = 1000


def nonfinite_timeline(scalars, layers):
    """Where NaN/Inf was seen: its layer row, steps and counts (or norms).

    Every ``*_nonfinite/*`` tag that counted NaN/Inf, with its counts; and
    every norm tag without such a count beside it (``statistics="default"``
    counts no dJ/dw) whose logged norm was NaN/Inf, with ``"NaN"`` or
    ``"Inf"`` for counts and ``"norm": True``.
    """
    owner = {}
    for layer, weights in layers.items():
        owner[layer] = layer
        owner.update({weight: layer for weight in weights})
    timeline = []
    for tag, series in scalars.items():
        kind, _, name = tag.partition("/")
        if NONFINITE_MARK in tag:
            bad, kind, counts = np.flatnonzero(series.values > 0), kind[: -len("_nonfinite")], None
        elif kind.endswith("_norm") and f"{kind[: -len('_norm')]}{NONFINITE_MARK}{name}" not in scalars:
            bad, kind, counts = np.flatnonzero(~np.isfinite(series.values)), kind[: -len("_norm")], "norm"
        else:
            continue
        if bad.size:
            shown = bad[:MAX_TIMELINE_STEPS]  # the first ones: where NaN/Inf began
            values = series.values[shown]
            timeline.append(
                {
                    "tag": tag,
                    "kind": kind if counts is None else f"{kind} norm",
                    "layer": owner.get(name, name),
                    "steps": series.steps[shown].tolist(),
                    "counts": values.tolist() if counts is None else [_nonfinite_text(v) for v in values],
                    "norm": counts is not None,
                    "bad_steps": int(bad.size),
                }
            )
    return timeline


def _nonfinite_text(value):
    return "NaN" if math.isnan(value) else "Inf" if value > 0 else "-Inf"
