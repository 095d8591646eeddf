"""Per-layer series from the scalars that `kgrad.read_logs` returns.

Shared by `kgrad.health_report` (the latest values) and the kgrad tab of
TensorBoard (every step): which logged weights belong to which layer, series
aligned on the steps they share, and the layer-wide gradient norm and update
ratio computed from per-weight ones.

Example:

>>> import numpy as np
>>> from kgrad.logs.reading import Series
>>> from kgrad.report import layer_series
>>> scalars = {
...     "grad_norm/dense": Series(np.array([0, 10]), np.array([1.0, 2.0])),
...     "weight_grad_norm/dense/kernel": Series(np.array([0, 10]), np.array([3.0, 3.0])),
...     "weight_grad_norm/dense/bias": Series(np.array([0, 10]), np.array([4.0, 0.0])),
... }
>>> layer_series.layer_weights(scalars)
{'dense': ['dense/kernel', 'dense/bias']}
>>> layer_series.combined_norm(scalars, "weight_grad_norm", ["dense/kernel", "dense/bias"]).values.tolist()
[5.0, 3.0]
"""

import numpy as np

from kgrad.logs.reading import Series


def layer_weights(scalars):
    """Layer name -> its weight paths, layers in logged (forward) order.

    Layers come from ``grad_norm/`` and ``activation_*/`` tags; a weight
    ``<layer>/kernel`` (or ``<nested model>/<layer>/kernel``) belongs to the layer whose name ends its
    owner path. A weight whose own layer was not captured belongs to the
    captured layer that holds that layer, when it holds no other uncaptured
    one: an LSTM's weights are its cell's (``lstm/lstm_cell/kernel``), and
    kgrad captures the LSTM, never its cell. Other weights of layers that
    were not captured form their own row, named by that owner path.
    """
    captured = []
    for tag in scalars:
        prefix, _, name = tag.partition("/")
        if (prefix == "grad_norm" or prefix.startswith("activation_")) and name not in captured:
            captured.append(name)
    layers = {name: [] for name in captured}
    uncaptured = {}  # owner path -> its weight paths
    for tag in scalars:
        if tag.startswith("weight_grad_norm/"):
            path = tag[len("weight_grad_norm/") :]
            owner = path.rpartition("/")[0] or path
            layer = _captured_layer(captured, owner)
            if layer is None:
                uncaptured.setdefault(owner, []).append(path)
            else:
                layers[layer].append(path)
    holders = {owner: _holder(captured, owner) for owner in uncaptured}
    held = [holder for holder in holders.values() if holder is not None]
    row_of_owner = {}
    for owner, paths in uncaptured.items():
        holder = holders[owner]
        row_of_owner[owner] = holder if holder is not None and held.count(holder) == 1 else owner
        layers.setdefault(row_of_owner[owner], []).extend(paths)
    weight_rows = []
    for tag in scalars:
        if tag.startswith("weight_grad_norm/"):
            owner = tag[len("weight_grad_norm/") :].rpartition("/")[0] or tag[len("weight_grad_norm/") :]
            weight_rows.append(row_of_owner.get(owner) or _captured_layer(captured, owner))
    return {row: layers[row] for row in _forward_order(captured, weight_rows)}


def _forward_order(captured, weight_rows):
    """The rows in forward order, from the captured layers' order and the weights' order.

    Both orders are forward orders (Keras lists weights in the order their
    layers were built); rows of uncaptured layers are known from the weights
    only, and go where their weights are among the captured layers'. A captured
    layer without weights (an activation) stays right after the layer before it.

    >>> _forward_order(["conv1", "relu", "dense_2"], ["conv1", "conv2", "dense_1", "dense_2"])
    ['conv1', 'relu', 'conv2', 'dense_1', 'dense_2']
    """
    with_weights = set(weight_rows)
    order, next_captured = [], 0
    for row in weight_rows:
        if row in order:
            continue
        if row in captured:
            end = captured.index(row) + 1
        else:  # first the weightless captured layers that follow the last row placed
            end = next_captured
            while end < len(captured) and captured[end] not in with_weights:
                end += 1
        order += [name for name in captured[next_captured:end] if name not in order]
        next_captured = max(next_captured, end)
        if row not in order:
            order.append(row)
    return order + [name for name in captured[next_captured:] if name not in order]


def _captured_layer(captured, owner):
    """The captured layer named by the owner path of a weight, or ``None``."""
    matches = [name for name in captured if owner == name or owner.endswith("/" + name)]
    return max(matches, key=len) if matches else None


def _holder(captured, owner):
    """The innermost captured layer that holds the layer at ``owner``, or ``None``."""
    parts = owner.split("/")
    for end in range(len(parts) - 1, 0, -1):
        layer = _captured_layer(captured, "/".join(parts[:end]))
        if layer is not None:
            return layer
    return None


def aligned(series_list):
    """The steps all series share (sorted) and their values, ``[series, steps]``.

    A step logged twice (e.g. a resumed run) keeps its last value.
    """
    by_step = [dict(zip(series.steps.tolist(), series.values.tolist())) for series in series_list]
    common = sorted(set.intersection(*(set(values) for values in by_step)))
    values = np.array([[values[step] for step in common] for values in by_step], np.float64)
    return np.array(common, np.int64), values.reshape(len(series_list), len(common))


def series(scalars, tag):
    """The `Series` of ``tag`` sorted by step (one value per step), or ``None``."""
    if tag not in scalars:
        return None
    steps, values = aligned([scalars[tag]])
    return Series(steps, values[0])


def combined_norm(scalars, prefix, names):
    """The L2 norm of several tensors from their ``<prefix>/<name>`` norms, or ``None``."""
    present = [scalars[f"{prefix}/{name}"] for name in names if f"{prefix}/{name}" in scalars]
    if not present:
        return None
    steps, values = aligned(present)
    return Series(steps, np.sqrt(np.sum(np.square(values), axis=0)))


def update_ratio(scalars, weights):
    """‖Δw‖/‖w‖ over all of a layer's weights at every step, or ``None``.

    ``None`` when a weight's ratio or norm was not logged. Per step, ``inf``
    when a weight's logged ratio or norm is not finite, and NaN where the
    logs do not hold the layer's ratio: a weight that was all zeros before
    the step moved (its ratio is 1, "all of its change", so the size of that
    change is not logged) beside weights that were not zero.
    """
    ratios = [scalars.get(f"update_ratio/{weight}") for weight in weights]
    norms = [scalars.get(f"weight_norm/{weight}") for weight in weights]
    if not weights or any(found is None for found in ratios + norms):
        return None
    steps, values = aligned(ratios + norms)
    ratio, norm = values[: len(weights)], values[len(weights) :]
    # ‖Δw_i‖ = ratio_i × ‖w_i‖ of each weight that was not zero, and norms of
    # a union add in squares. When every weight was zero, the layer's ratio
    # is by the same rule as one weight's: 1 if it moved, else 0.
    total = np.sqrt(np.sum(np.square(norm), axis=0))
    update = np.sqrt(np.sum(np.square(ratio * norm), axis=0))
    with np.errstate(divide="ignore", invalid="ignore"):
        combined = np.where(total > 0, update / total, np.any(ratio > 0, axis=0).astype(np.float64))
    unknown = np.any((norm == 0) & (ratio > 0), axis=0) & (total > 0)
    combined = np.where(unknown, np.nan, combined)
    nonfinite = ~np.all(np.isfinite(values), axis=0)
    return Series(steps, np.where(nonfinite, np.inf, combined))
