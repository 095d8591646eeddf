"""The kind of a logged histogram and the x-range its panel shares with its kind's tags.

A histogram is linear (equal buckets between a tensor's min and max, the
only kind before log-magnitude buckets) or log-magnitude (the fixed edges of
`kgrad.plan.histogram_buckets`); its edges say which, so logs written by any
version read the same way. A linear panel's range is ``[low, high]`` of the
values; a log-magnitude panel's is ``[smallest, largest]`` magnitude of a
non-zero bucket that holds something, drawn on both sides of zero.

Example:

>>> import numpy as np
>>> from kgrad.plan.histogram_buckets import log_magnitude_edges
>>> edges = log_magnitude_edges()
>>> log = np.stack([edges[:-1], edges[1:], np.zeros(65)], axis=1)
>>> log[41, 2] = 3  # [1e-8, 10**-7.5]
>>> histogram_kind(log), [f"{edge:.3g}" for edge in magnitude_range([log])]
('log', ['1e-08', '3.16e-08'])
"""

import math

import numpy as np

from kgrad.plan.histogram_buckets import is_log_magnitude


def histogram_kind(array):
    """``"log"`` or ``"linear"``: the kind of a ``[k, 3]`` (or ``[steps, k, 3]``) histogram."""
    array = np.asarray(array)
    first = array.reshape([-1] + list(array.shape[-2:]))[0] if array.size else array
    if first.ndim != 2 or not first.shape[0]:
        return "linear"
    return "log" if is_log_magnitude(np.append(first[:, 0], first[-1, 1])) else "linear"


def value_range(arrays):
    """[low, high] of the finite edges of the buckets that hold something, or None."""
    low, high = math.inf, -math.inf
    for array in arrays:
        edges, counts = np.asarray(array)[..., :2], np.asarray(array)[..., 2]
        edges = edges[(counts > 0) & np.all(np.isfinite(edges), axis=-1)]
        if edges.size:
            low, high = min(low, float(edges.min())), max(high, float(edges.max()))
    return [low, high] if low <= high else None


def magnitude_range(arrays):
    """[smallest, largest] |edge| of the non-zero log-magnitude buckets that hold something, or None."""
    low, high = math.inf, -math.inf
    for array in arrays:
        array = np.asarray(array)
        middle = array.shape[-2] // 2  # the zero bucket: no magnitude of its own
        sides = np.delete(array, middle, axis=-2)
        magnitudes = np.abs(sides[..., :2])[sides[..., 2] > 0]
        if magnitudes.size:
            low, high = min(low, float(magnitudes.min())), max(high, float(magnitudes.max()))
    return [low, high] if low <= high else None


def shared_range(histograms, prefix, kind):
    """The range of every ``kind`` histogram of ``prefix`` in a run (``{tag: Series}``)."""
    arrays = []
    for tag, series in histograms.items():
        if tag.startswith(prefix):
            values = series.values if isinstance(series.values, list) else [series.values]
            arrays.extend(array for array in values if histogram_kind(array) == kind)
    if kind == "log":
        return magnitude_range(arrays) or [1e-12, 1e4]
    return value_range(arrays) or [-1.0, 1.0]
