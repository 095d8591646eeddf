"""Log-magnitude histogram counts computed another way than kgrad does (NumPy only, any backend)."""

import numpy as np

from kgrad.plan.histogram_buckets import BUCKETS_PER_SIDE, MAGNITUDE_EDGES


def log_magnitude_counts(values):
    """Counts per bucket by `np.searchsorted` on the float32 magnitude edges, element by element."""
    values = np.asarray(values, np.float32).ravel()
    side = BUCKETS_PER_SIDE
    counts = np.zeros(2 * side + 1, np.int64)
    for value in values[np.isfinite(values)]:
        if abs(value) < np.finfo(np.float32).tiny:  # ±0, and the subnormals devices flush to 0
            counts[side] += 1
            continue
        # E[j] <= |v| < E[j + 1], beyond the range on the outermost bucket of the side.
        j = int(np.searchsorted(MAGNITUDE_EDGES, np.abs(value), side="right")) - 1
        j = min(max(j, 0), side - 1)
        counts[side + 1 + j if value > 0 else side - 1 - j] += 1
    return counts


def hard_values(seed=0):
    """Zeros (±0), NaN, ±Inf, every edge and its float32 neighbours, both signs, beyond the range, random."""
    edges = MAGNITUDE_EDGES
    below, above = np.nextafter(edges, np.float32(0)), np.nextafter(edges, np.float32(np.inf))
    near = np.concatenate([edges, below, above])
    beyond = np.array([1e-30, 1e-45, -1e-40, 2e-38, 5e-13, 2e4, 3e38, np.finfo(np.float32).max], np.float32)
    rng = np.random.default_rng(seed)
    random = (10.0 ** rng.uniform(-14, 6, size=500)).astype(np.float32)
    magnitudes = np.concatenate([near, beyond, random]).astype(np.float32)
    special = np.array([0.0, -0.0, 0.0, np.nan, np.inf, -np.inf, np.nan], np.float32)
    values = np.concatenate([magnitudes, -magnitudes[::3], special])
    return rng.permutation(values).astype(np.float32)
