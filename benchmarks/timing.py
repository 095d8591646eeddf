"""Pure helpers: the interleaving order, sample sizes and ratio statistics.

Nothing here runs TensorFlow; each function is small enough to check by hand.
"""

import math

import numpy as np


def round_triplets(configs, round_index):
    """The order of one round: triplets ``(before, baseline, after)``.

    Configurations are taken two at a time around one baseline sample, so
    every configuration sample is next to a baseline sample (its pair) and a
    baseline sample serves two configurations, one on each side. Odd rounds
    reverse everything, so each configuration alternates between running
    before and after its baseline (A B, B A, ...).

    Args:
        configs: Names of the configurations compared with one baseline.
        round_index: 0, 1, 2, ...

    Returns:
        A list of ``(before, after)`` name pairs, either of which may be
        ``None``; the baseline runs between them.

    Example:

    >>> round_triplets(["a", "b", "c"], 0)
    [('a', 'b'), ('c', None)]
    >>> round_triplets(["a", "b", "c"], 1)
    [(None, 'c'), ('b', 'a')]
    """
    triplets = []
    for start in range(0, len(configs), 2):
        chunk = list(configs[start : start + 2]) + [None]
        triplets.append((chunk[0], chunk[1]))
    if round_index % 2:
        triplets = [(after, before) for before, after in reversed(triplets)]
    return triplets


def epochs_per_sample(baseline_epoch_cpu, sample_cpu):
    """Whole epochs per sample so the baseline's sample lasts ``sample_cpu``.

    >>> epochs_per_sample(0.35, 1.0), epochs_per_sample(2.5, 1.0)
    (3, 1)
    """
    if not baseline_epoch_cpu or baseline_epoch_cpu <= 0:
        return 1
    return max(1, math.ceil(sample_cpu / baseline_epoch_cpu))


def pairs_within_budget(pairs, min_pairs, sample_cpu, baseline_cpu, budget):
    """Pairs for a configuration whose timed samples must fit ``budget`` CPU-s.

    Slow configurations (ratios of several x, far above the noise) need
    fewer pairs; no configuration gets fewer than ``min_pairs``.

    >>> pairs_within_budget(11, 5, 1.2, 1.0, 60.0), pairs_within_budget(11, 5, 20.0, 1.0, 60.0)
    (11, 5)
    """
    if budget is None:
        return pairs
    affordable = math.floor(budget / max(sample_cpu + baseline_cpu, 1e-9))
    return max(min(pairs, affordable), min(min_pairs, pairs))


#: A calibration ratio at most this far above a time target counts as near it.
NEAR_TARGET = 0.10


def near_target(time_target, sample_cpu, baseline_cpu):
    """Whether a configuration's verdict is decided by a few percent.

    Its calibration ratio (``sample_cpu / baseline_cpu``) is at most
    `NEAR_TARGET` above its time target, or under it.

    >>> near_target(1.03, 1.05, 1.0), near_target(1.25, 2.2, 1.0), near_target(None, 1.0, 1.0)
    (True, False, False)
    """
    if time_target is None or baseline_cpu <= 0:
        return False
    return sample_cpu / baseline_cpu <= time_target + NEAR_TARGET


def median_interval(ratios, draws=2000, seed=0):
    """A bootstrap 95% interval of the median of ``ratios`` (the same for the same ratios).

    >>> low, high = median_interval([1.0, 1.1, 0.9, 1.05, 0.95])
    >>> 0.9 <= low <= 1.0 <= high <= 1.1
    True
    """
    values = np.asarray(ratios, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(values, (draws, values.size)), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def ratio_summary(ratios):
    """Median, its 95% interval, quartiles and range of per-pair ratios (``None`` when empty).

    >>> summary = ratio_summary([1.0, 1.2, 1.1])
    >>> summary["median"], summary["median_low"] <= 1.1 <= summary["median_high"]
    (1.1, True)
    """
    if not ratios:
        return None
    values = np.asarray(ratios, dtype=float)
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    low, high = median_interval(values)
    return {
        "median": float(median),
        "median_low": low,
        "median_high": high,
        "q1": float(q1),
        "q3": float(q3),
        "min": float(values.min()),
        "max": float(values.max()),
        "n": int(values.size),
    }


def noise_floor(aa_summary):
    """Half-width of the A/A control: how far from 1.0 noise alone moves a ratio.

    The larger of the A/A median's distance to 1 and half its interquartile
    range; 0 when there is no A/A control.
    """
    if not aa_summary:
        return 0.0
    return max(abs(aa_summary["median"] - 1.0), (aa_summary["q3"] - aa_summary["q1"]) / 2)


def steady_step_cpu(step_stamps, every_n_steps):
    """CPU per step after the first stamp, over whole probe periods.

    Args:
        step_stamps: Process CPU time after each step, from the last setup
            step (tracing and compiling are not steady steps).
        every_n_steps: The configuration's period: the window spans a
            multiple of it so it holds its share of probed steps.

    Returns:
        ``(seconds_per_step, whole_periods)``; ``whole_periods`` is False
        when fewer than one period followed the first step (then the figure
        covers what there is, and is a lower bound for a probing config).

    >>> steady_step_cpu([5.0, 5.5, 6.0, 6.5], 2)
    (0.5, True)
    """
    steps = len(step_stamps) - 1
    if steps < 1:
        return None, False
    span = (steps // every_n_steps) * every_n_steps
    whole = span > 0
    span = span if whole else steps
    return (step_stamps[span] - step_stamps[0]) / span, whole
