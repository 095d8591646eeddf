"""The gradient noise scale B_simple and the gradient signal-to-noise ratio, on the host.

McCandlish et al. 2018, "An Empirical Model of Large-Batch Training": with
G the true gradient and Σ the covariance of per-example gradients,
B_simple = tr(Σ) / |G|² estimates the *critical batch size*: well below it, a
larger batch divides the steps needed almost proportionally (each example
still counts); well above it, more examples per step buy few steps.

**Estimators** (their appendix A). A gradient averaged over a batch of size
b has E|G_b|² = |G|² + tr(Σ)/b. From two batch sizes b < B:

    |G|²  ≈ (B |G_B|² − b |G_b|²) / (B − b)
    tr(Σ) ≈ (|G_b|² − |G_B|²) / (1/b − 1/B)

both unbiased. kgrad takes b = 1 inside the probed batch: the per-example
gradients G_i (each example's loss on its own) give E[mean_i |G_i|²] =
|G|² + tr(Σ), and the batch gradient G_B = mean_i G_i. With
m = mean_i |G_i|² (tag ``noise_example_sq_norm_mean``) and g = |G_B|²
(``noise_batch_sq_norm``):

    |G|²  ≈ (B g − m) / (B − 1)        tr(Σ) ≈ (m − g) B / (B − 1)

(identically, tr(Σ) is the trace of the unbiased sample covariance of the
G_i, and |G|² is |G_B|² less its expected noise tr(Σ)/B). B_simple is a ratio:
its scale is that of the loss's, and a reduction that multiplies every G_i by
the same constant (``sum`` instead of ``sum_over_batch_size``) leaves it
unchanged.

**Smoothing.** One probe's ratio of two noisy estimates is biased (and |G|²
can come out negative); as the paper recommends, `NoiseScaleSmoother` keeps
exponential moving averages of the numerator and the denominator separately
and divides those.

**Signal-to-noise** of a layer (or the model) at batch size B:
SNR = |G|² / (tr(Σ)/B) = B / B_simple, the squared norm of the mean gradient
over the expected squared norm of the noise in a batch gradient of size B.
Above 1 the batch gradient is mostly signal; below 1 mostly noise.
"""

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class NoiseEstimate:
    """Unbiased estimates of |G|² and tr(Σ) from one batch (or smoothed).

    Attributes:
        gradient_sq_norm: |G|², the squared norm of the true gradient.
        trace: tr(Σ), the summed variance of the per-example gradients.
    """

    gradient_sq_norm: float
    trace: float

    @property
    def b_simple(self):
        """tr(Σ)/|G|², or ``None`` when the estimate of |G|² is not positive."""
        if not self.gradient_sq_norm > 0:
            return None
        return self.trace / self.gradient_sq_norm

    def snr(self, batch_size):
        """|G|² / (tr(Σ)/B) at batch size B, or ``None`` unless both estimates are positive."""
        if not (self.trace > 0 and self.gradient_sq_norm > 0):
            return None
        return batch_size * self.gradient_sq_norm / self.trace


def two_batch_estimate(small_sq_norm, small_batch, big_sq_norm, big_batch):
    """McCandlish et al.'s estimators from |G_b|² and |G_B|² at batch sizes b < B.

    Example:

    >>> estimate = two_batch_estimate(small_sq_norm=11.0, small_batch=1, big_sq_norm=2.0, big_batch=10)
    >>> estimate.gradient_sq_norm, estimate.trace, estimate.b_simple
    (1.0, 10.0, 10.0)
    """
    if not 0 < small_batch < big_batch:
        raise ValueError(
            f"Batch sizes must satisfy 0 < small_batch < big_batch. Received: "
            f"small_batch={small_batch!r}, big_batch={big_batch!r}."
        )
    gradient = (big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch)
    trace = (small_sq_norm - big_sq_norm) / (1.0 / small_batch - 1.0 / big_batch)
    return NoiseEstimate(gradient, trace)


def batch_estimate(example_sq_norm_mean, batch_sq_norm, batch_size):
    """|G|² and tr(Σ) from one batch: `two_batch_estimate` with b = 1 (the examples).

    Args:
        example_sq_norm_mean: mean_i |G_i|², the per-example gradients' squared norms.
        batch_sq_norm: |mean_i G_i|², the batch gradient's.
        batch_size: B, at least 2.

    Returns:
        A `NoiseEstimate`, or ``None`` for a batch of one.

    Example:

    >>> batch_estimate(example_sq_norm_mean=11.0, batch_sq_norm=2.0, batch_size=10).b_simple
    10.0
    """
    if batch_size < 2:
        return None
    return two_batch_estimate(example_sq_norm_mean, 1, batch_sq_norm, batch_size)


class NoiseScaleSmoother:
    """Exponential moving averages of |G|² and tr(Σ), kept apart, over probes.

    Public as ``kgrad.NoiseScaleSmoother``. Feed it each probe of a
    ``GradientProbe(instruments=["per_example"], on_probe=...)``:
    ``smoother.update(s["global/noise_example_sq_norm_mean"],
    s["global/noise_batch_sq_norm"], s["global/batch_size"])`` with
    ``s = record.scalars``; ``b_simple`` and ``snr`` are then the smoothed
    gradient noise scale and signal-to-noise ratio (``kgrad report`` does the
    same from the event files).

    Args:
        decay: Weight of the past at each update, in ``[0, 1)``; the averages
            are debiased as Adam's moments are (their ratio does not need it).

    Example:

    >>> smoother = NoiseScaleSmoother(decay=0.5)
    >>> smoother.update(11.0, 2.0, 10).update(26.0, 3.5, 10).b_simple  # tr(Σ) 10 then 25, |G|² 1
    20.0
    """

    def __init__(self, decay=0.9):
        if not (isinstance(decay, (int, float)) and 0 <= decay < 1):
            raise ValueError(f"`decay` must be a number in [0, 1). Received: decay={decay!r}.")
        self.decay = decay
        self.count = 0
        self._gradient = 0.0
        self._trace = 0.0
        self.batch_size = None

    def update(self, example_sq_norm_mean, batch_sq_norm, batch_size):
        """Adds one probe's sums (what the ``noise_*`` tags hold); returns ``self``."""
        estimate = batch_estimate(float(example_sq_norm_mean), float(batch_sq_norm), float(batch_size))
        finite = estimate is not None and math.isfinite(estimate.gradient_sq_norm + estimate.trace)
        if not finite:
            return self
        self._gradient = self.decay * self._gradient + (1 - self.decay) * estimate.gradient_sq_norm
        self._trace = self.decay * self._trace + (1 - self.decay) * estimate.trace
        self.count += 1
        self.batch_size = float(batch_size)
        return self

    @property
    def estimate(self):
        """The smoothed `NoiseEstimate`, or ``None`` before the first update."""
        if self.count == 0:
            return None
        debias = 1 - self.decay**self.count
        return NoiseEstimate(self._gradient / debias, self._trace / debias)

    @property
    def b_simple(self):
        """Smoothed B_simple, or ``None`` (no probe yet, or |G|² not positive)."""
        return None if self.estimate is None else self.estimate.b_simple

    @property
    def snr(self):
        """Smoothed SNR at the latest batch size, or ``None``."""
        return None if self.estimate is None else self.estimate.snr(self.batch_size)


def smoothed_from_scalars(scalars, layer=None, decay=0.9):
    """A `NoiseScaleSmoother` fed with every probe of a run's ``noise_*`` tags.

    Args:
        scalars: ``{tag: Series}``, a run's ``"scalars"`` from `kgrad.read_logs`.
        layer: A layer name, or ``None`` for the whole model (``global/`` tags).
        decay: See `NoiseScaleSmoother`.

    Returns:
        The smoother, or ``None`` when the run holds no such tags.
    """
    if layer is None:
        tags = ("global/noise_example_sq_norm_mean", "global/noise_batch_sq_norm")
    else:
        tags = (f"noise_example_sq_norm_mean/{layer}", f"noise_batch_sq_norm/{layer}")
    series = [scalars.get(tag) for tag in tags + ("global/batch_size",)]
    if any(item is None for item in series):
        return None
    by_step = [dict(zip(item.steps.tolist(), item.values.tolist())) for item in series]
    smoother = NoiseScaleSmoother(decay)
    for step in sorted(set.intersection(*(set(values) for values in by_step))):
        smoother.update(*(values[step] for values in by_step))
    return smoother


def layers_in_scalars(scalars):
    """The layers with noise sums in a run's scalars, in logged order."""
    prefix = "noise_example_sq_norm_mean/"
    return [tag[len(prefix) :] for tag in scalars if tag.startswith(prefix)]


def suggestion(b_simple, batch_size):
    """What the critical batch size suggests for the batch size in use (one phrase).

    Example:

    >>> suggestion(800.0, 32)
    'batch well below B_simple: a larger batch (up to ~800) would need proportionally fewer steps'
    """
    if b_simple is None:
        return "no estimate: the gradient's signal is below the noise so far (|G|² <= 0); probe longer"
    if batch_size < b_simple / 2:
        return (
            f"batch well below B_simple: a larger batch (up to ~{b_simple:.0f}) would need "
            "proportionally fewer steps"
        )
    if batch_size > 2 * b_simple:
        return (
            "batch well above B_simple: more examples per step buy few steps; a smaller batch "
            "would use fewer examples for the same progress"
        )
    return "batch near B_simple: a good trade-off between steps and examples"


@dataclasses.dataclass(frozen=True)
class CriticalBatch:
    """What a run's ``noise_*`` tags say about its batch size (`critical_batch`).

    Attributes:
        b_simple: Smoothed whole-model B_simple, or ``None`` (not every weight
            had per-example norms, or |G|² was not positive).
        batch_size: The batch size of the latest probe.
        probes: Probes smoothed over.
        snr: Smoothed whole-model SNR at ``batch_size``, or ``None``.
        layers: ``{layer: (b_simple, snr)}``, smoothed, in logged order.
    """

    b_simple: object
    batch_size: float
    probes: int
    snr: object
    layers: dict


def critical_batch(scalars, decay=0.9):
    """The `CriticalBatch` of one run's scalars, or ``None`` without ``noise_*`` tags."""
    layers = {}
    for layer in layers_in_scalars(scalars):
        smoother = smoothed_from_scalars(scalars, layer, decay)
        if smoother is not None and smoother.count:
            layers[layer] = (smoother.b_simple, smoother.snr)
    whole = smoothed_from_scalars(scalars, None, decay)
    if not layers and (whole is None or not whole.count):
        return None
    if whole is None or not whole.count:
        batch = scalars["global/batch_size"].values[-1]
        return CriticalBatch(None, float(batch), 0, None, layers)
    return CriticalBatch(whole.b_simple, whole.batch_size, whole.count, whole.snr, layers)


def describe(critical):
    """One line for ``kgrad report``: B_simple beside the batch size in use, and what it suggests.

    Example:

    >>> print(describe(CriticalBatch(812.0, 32.0, 10, 0.04, {"dense": (812.0, 0.04)})))
    critical batch size (B_simple, whole model, smoothed over 10 probes) ~812 vs batch size 32 in use: \
batch well below B_simple: a larger batch (up to ~812) would need proportionally fewer steps; \
gradient SNR at this batch 0.04 (per layer 0.04 dense)
    """
    batch = f"{critical.batch_size:.0f}"
    snrs = [(snr, name) for name, (_, snr) in critical.layers.items() if snr is not None]
    parts = []
    if snrs:
        (low, low_name), (high, high_name) = min(snrs), max(snrs)
        parts.append(f"{low:.2g} {low_name}" + ("" if len(snrs) == 1 else f" .. {high:.2g} {high_name}"))
    missing = [name for name, (_, snr) in critical.layers.items() if snr is None]
    if missing:
        named = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        parts.append(f"no estimate for {len(missing)} of {len(critical.layers)} layers, {named}: "
                     "its smoothed |G|² or tr(Σ) estimate is not positive")
    per_layer = f" (per layer {'; '.join(parts)})" if parts else ""
    if critical.probes == 0:
        return (
            f"critical batch size: no whole-model estimate (not every trainable weight has "
            f"per-example norms); batch size {batch} in use{'; gradient SNR' + per_layer if parts else ''}"
        )
    value = "-" if critical.b_simple is None else f"~{critical.b_simple:.3g}"
    snr = "-" if critical.snr is None else f"{critical.snr:.2g}"
    return (
        f"critical batch size (B_simple, whole model, smoothed over {critical.probes} probes) {value} "
        f"vs batch size {batch} in use: {suggestion(critical.b_simple, critical.batch_size)}; "
        f"gradient SNR at this batch {snr}{per_layer}"
    )
