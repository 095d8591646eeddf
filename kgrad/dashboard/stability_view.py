"""The kgrad tab's stability view of one run, as a JSON-ready dict.

On one time axis (every step that logged a stability signal): a layer x step
matrix of ``adam_rms`` (``instruments=["optimizer"]``), lines of the largest
logit per output (``logit_max_max/``, ``instruments=["logits"]``) and of the
largest attention score per attention layer (the max over its heads of
``attention_logit_max/<layer>/head_<h>``, ``instruments=["attention"]``), the
loss, and where each signal spiked. The spikes are those of `kgrad report`
(`kgrad.report.stability.StabilityReport`, which examines the same maxima over
heads): the rule is never written again here or in the page.

A row of the matrix is a layer: the RMS of g/(√v̂+ε) over the elements of its
logged weights (``statistics="default"`` logs kernels', not biases'),
sqrt(Σ nᵢ·rmsᵢ² / Σ nᵢ) for weights of nᵢ elements, when the logs hold the shapes
of every such weight (``kgrad/weight_shapes``); without them that RMS cannot be
computed, and the row is the max over the layer's logged weights (the payload's
``aggregate`` says which). A cell is computed only where every
weight of its layer was logged; else it is "not logged" (NaN), never a guess.

Example:

>>> import numpy as np
>>> from kgrad.logs.reading import Series
>>> from kgrad.report.stability import stability_report
>>> steps = np.arange(3)
>>> scalars = {"adam_rms/dense/kernel": Series(steps, np.array([1.0, 2.0, 3.0])),
...            "adam_rms/dense/bias": Series(steps, np.array([2.0, 2.0, 2.0]))}
>>> view = stability_view("run", scalars, {"dense/kernel": (3, 1), "dense/bias": (1,)},
...                       stability_report(scalars))
>>> view["rms"]["aggregate"], view["rms"]["layers"], view["steps"]
('rms', ['dense'], [0, 1, 2])
>>> [round(float(v), 3) for v in decode(view["rms"]["values"])]  # sqrt((3·1² + 1·2²) / 4), ...
[1.323, 2.0, 2.784]
"""

import base64

import numpy as np

from kgrad.plan.tag_names import LOSS_TAG
from kgrad.report.stability import LAYER_SIGNALS, layer_of

ADAM_PREFIX = "adam_rms/"
LOGIT_PREFIX = "logit_max_max/"
ATTENTION_PREFIX = "attention_logit_max/"
#: What to pass to `kgrad.GradientProbe` for each part of the view.
INSTRUMENTS = {"rms": "optimizer", "logits": "logits", "attention": "attention"}
_WHAT = {"rms": "adam_rms", "logits": "max logits", "attention": "attention maxima"}


def _encode(values):
    # As `kgrad.dashboard.views.encode_floats` (views imports this module, not the reverse).
    return base64.b64encode(np.ascontiguousarray(values, "<f4").tobytes()).decode("ascii")


def decode(text):
    """A matrix's ``values`` as a flat float32 array (row-major)."""
    return np.frombuffer(base64.b64decode(text), "<f4")


def _aligned(series, steps):
    """``series`` on ``steps``: NaN where it was not logged, its values elsewhere."""
    row = np.full(len(steps), np.nan)
    row[np.searchsorted(steps, series.steps)] = series.values
    return row


def _logged(series, steps):
    """Bool mask of the ``steps`` at which ``series`` holds a value (NaN/Inf included)."""
    mask = np.zeros(len(steps), bool)
    mask[np.searchsorted(steps, series.steps)] = True
    return mask


def _groups(scalars, prefix, owner):
    """``{row name: [tags]}`` of the tags under ``prefix``, rows in logged (forward) order."""
    groups = {}
    for tag in scalars:
        if tag.startswith(prefix):
            groups.setdefault(owner(tag), []).append(tag)
    return groups


def _combined(scalars, tags, steps, sizes):
    """Per step: RMS over the elements of ``tags`` (``sizes`` given) or their max; NaN if any is missing."""
    values = np.array([_aligned(scalars[tag], steps) for tag in tags])
    logged = np.all([_logged(scalars[tag], steps) for tag in tags], axis=0)
    with np.errstate(invalid="ignore", over="ignore"):
        if sizes is None:
            row = np.max(values, axis=0)
        else:
            weights = np.array([sizes[tag] for tag in tags], np.float64)[:, None]
            row = np.sqrt(np.sum(weights * np.square(values), axis=0) / np.sum(weights))
    # A logged NaN/Inf is the blow-up itself: Inf, which the page draws as NaN/Inf.
    row = np.where(logged & ~np.isfinite(row), np.inf, row)
    return np.where(logged, row, np.nan)


def _rms_matrix(scalars, shapes, steps, report):
    groups = _groups(scalars, ADAM_PREFIX, lambda tag: layer_of(tag)[0])
    if not groups:
        return None
    tags = [tag for group in groups.values() for tag in group]
    paths = {tag: tag[len(ADAM_PREFIX):] for tag in tags}
    known = all(paths[tag] in shapes for tag in tags)
    sizes = {tag: float(np.prod(shapes[paths[tag]])) for tag in tags} if known else None
    matrix = np.array([_combined(scalars, group, steps, sizes) for group in groups.values()])
    spikes = []
    for row, group in enumerate(groups.values()):
        for tag in group:
            found = report.spikes.get(tag, ())
            spikes += [[row, int(np.searchsorted(steps, s.step)), s.step, tag] for s in found]
    finite = matrix[np.isfinite(matrix) & (matrix > 0)]
    return {
        "aggregate": "rms" if known else "max",
        "layers": list(groups),
        "steps": steps.tolist(),
        "scale": "log",
        "values": _encode(matrix),
        "min": float(finite.min()) if finite.size else None,
        "max": float(finite.max()) if finite.size else None,
        "spikes": sorted(spikes, key=lambda spike: (spike[1], spike[0])),
    }


def _line(name, values, logged, steps, spike_steps, tags, signal):
    """One line of a chart: finite values (``None`` elsewhere), logged NaN/Inf, spikes."""
    finite = np.isfinite(values)
    return {
        "name": name,
        "signal": signal,  # as a loss spike's leaders name it
        "tags": tags,
        "values": [float(v) if ok else None for v, ok in zip(values, finite)],
        "nonfinite": np.flatnonzero(logged & ~finite).tolist(),
        "spikes": [int(np.searchsorted(steps, step)) for step in spike_steps],
        "spike_steps": [int(step) for step in spike_steps],
    }


def _lines(scalars, prefix, owner, steps, report):
    """The lines of the tags under ``prefix``, one per ``owner(tag)`` (the max of its tags)."""
    lines = []
    for name, tags in _groups(scalars, prefix, owner).items():
        values = _combined(scalars, tags, steps, None)
        # The report's spikes of the line's signal: of its tag, or of the max over heads.
        reported = [prefix + name] if prefix == ATTENTION_PREFIX else tags
        spike_steps = [spike.step for tag in reported for spike in report.spikes.get(tag, ())]
        signal = LAYER_SIGNALS.get(prefix)
        lines.append(_line(name, values, ~np.isnan(values), steps, spike_steps, tags, signal))
    return lines or None


def _attention_owner(tag):
    layer, _, head = tag[len(ATTENTION_PREFIX):].rpartition("/")
    return layer if head.startswith("head_") and layer else tag[len(ATTENTION_PREFIX):]


def stability_view(run, scalars, shapes, report, skipped=()):
    """What the tab's stability view draws for one run.

    Args:
        run: The run name.
        scalars: The run's scalars (tag -> ``Series``, as `kgrad.read_logs`).
        shapes: ``{weight path: shape}`` (``kgrad/weight_shapes``; ``{}`` if none).
        report: The run's `kgrad.report.stability.StabilityReport`.
        skipped: The run's steps a `kgrad.NonFiniteGuard` skipped
            (`kgrad.report.skipped_steps.SkippedStep`): on the step axis too.

    Returns:
        ``{"run", "steps", "rms", "logits", "attention", "loss", "loss_spikes",
        "skipped", "missing", "rule"}``; ``rms`` is a layer x step matrix (base64
        float32) or ``None``, ``logits``, ``attention`` and ``loss`` lists of
        lines or ``None``; ``skipped`` one entry per skipped step (`skipped_entry`);
        ``missing`` names the parts not logged and the instrument that logs each.
    """
    tags = [t for t in scalars if t.startswith((ADAM_PREFIX, LOGIT_PREFIX, ATTENTION_PREFIX))]
    stepped = [scalars[tag].steps for tag in tags + ([LOSS_TAG] if tags and LOSS_TAG in scalars else [])]
    if tags and skipped:  # a skipped step has a column even where no signal was logged ("not logged")
        stepped.append(np.array([step.step for step in skipped], np.int64))
    steps = np.unique(np.concatenate(stepped)) if stepped else np.zeros(0, np.int64)

    view = {
        "run": run,
        "steps": steps.tolist(),
        "rms": _rms_matrix(scalars, shapes, steps, report),
        "logits": _lines(scalars, LOGIT_PREFIX, lambda tag: tag[len(LOGIT_PREFIX):], steps, report),
        "attention": _lines(scalars, ATTENTION_PREFIX, _attention_owner, steps, report),
        "loss": _lines({LOSS_TAG: scalars[LOSS_TAG]}, LOSS_TAG, lambda tag: "loss", steps, report)
        if tags and LOSS_TAG in scalars
        else None,
        "rule": f"above mean + {report.sigmas:g}σ of the previous {report.history} probes",
        "window": report.window,
    }
    view["missing"] = [
        {"part": part, "what": _WHAT[part], "instrument": INSTRUMENTS[part]}
        for part in INSTRUMENTS
        if view[part] is None
    ]
    view["loss_spikes"] = [_loss_spike(spike, steps) for spike in report.loss_spikes] if tags else []
    view["skipped"] = [skipped_entry(step, steps if tags else None) for step in skipped]
    return view


def skipped_entry(skipped, steps):
    """One skipped step for the page: its column (``None`` without an axis), score, leading layers, words.

    ``groups``: the layers that moved above the rule (each at its largest z-score), in
    groups whose sizes cannot be told apart (a tie), largest first; else the largest group.
    """
    column = None if steps is None else int(np.searchsorted(steps, skipped.step))
    entry = {"step": skipped.step, "column": column,
             "score": skipped.spike_score, "groups": [], "not_scored": [], "words": skipped.why}
    if skipped.leaders is not None:
        groups = skipped.leaders.layers()
        moved = [[lead for lead in group if abs(lead.z) >= skipped.leaders.sigmas] for group in groups]
        moved = [group for group in moved if group] or groups[:1]
        entry["groups"] = [[{"layer": lead.layer, "weight": lead.weight, "value_name": lead.value_name,
                             "z": lead.z} for lead in group] for group in moved]
        entry["not_scored"] = [{"weight": weight, "reason": reason}
                               for weight, reason in skipped.leaders.not_scored]
        entry["words"] = skipped.leaders.describe()
    return entry


def _loss_spike(spike, steps):
    finite = np.isfinite(spike.value)
    return {
        "step": spike.step,
        "column": int(np.searchsorted(steps, spike.step)),
        "value": spike.value if finite else ("NaN" if np.isnan(spike.value) else "Inf"),
        "mean": spike.mean,
        "std": spike.std,
        "leaders": [
            # At one probe a tie, largest first; its size in σ (None: NaN/Inf or a σ of 0).
            {"layer": lead.layer, "signal": lead.signal, "step": lead.step, "probes_ahead": lead.probes_ahead,
             "sigmas": lead.sigmas}
            for lead in spike.leaders
        ],
    }
