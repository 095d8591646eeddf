"""What a probe captures, validated once, shared by every entry point."""

import dataclasses

from kgrad.plan.histogram_buckets import resolve_bucket_count
from kgrad.plan.schedule import ProbeSchedule

#: Everything a probe can capture; ``capture=`` takes any subset.
CAPTURE_KINDS = (
    "activations",
    "activation_gradients",
    "prediction_gradient",
    "input_gradient",
    "weight_gradients",
)

#: What ``instruments=`` takes: ``"per_example"`` adds per-example gradient
#: norms of each supported layer's weights and the sums from which the
#: gradient noise scale is estimated; ``"optimizer"`` Adam's second-moment lag
#: (``adam_rms/``), gradient outliers and the update RMS from the optimizer's
#: own state; ``"logits"`` the max logit, log-sum-exp, entropy and top-1
#: probability of each output; ``"attention"`` the largest score and the entropy
#: of each attention layer's heads, on a sub-batch (see docs/instruments.md).
INSTRUMENTS = ("per_example", "optimizer", "logits", "attention")

#: What ``statistics=`` takes: ``"default"`` writes what people look at
#: (norms, update ratios, zero fractions, non-finite counts, gradient
#: histograms; see docs/tags.md), ``"all"`` every moment and histogram
#: of every captured tensor.
STATISTICS = ("default", "all")


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """Options of a probing ``train_step``.

    Args:
        layers: ``None`` (every leaf layer with weights), ``"all"``, a list of
            names or layer objects, or a predicate ``fn(layer) -> bool``.
        every_n_steps: Probe the steps whose index since ``fit`` started is a
            multiple of this (a positive ``int``; the first step is probed).
        capture: Subset of `CAPTURE_KINDS`, or ``"all"``.
        histograms: Whether to compute histograms besides the scalars.
        histogram_buckets: ``"log"`` (fixed buckets by sign and decade of
            magnitude, 1e-12 to 1e4, and one for exact zeros) or
            ``"linear"`` (``bucket_count`` equal buckets between each
            tensor's min and max); ``None``: ``"log"``, or ``"linear"``
            when ``bucket_count`` is given. See `kgrad.plan.histogram_buckets`.
        bucket_count: Buckets per linear histogram (``None``: 30). Once
            validated, the count a step computes (``LOG_BUCKET_COUNT``, 65,
            for ``"log"``).
        statistics: ``"default"`` or ``"all"`` (see `STATISTICS`).
        instruments: A subset of `INSTRUMENTS` (default: none).
        outlier_sigmas: With ``instruments=["optimizer"]``, a gradient entry
            is an outlier when |g − m̂| > outlier_sigmas·√max(v̂ − m̂², 0)
            (a positive number; OLMo-core's default, 6).
        attention_examples: With ``instruments=["attention"]``, how many
            examples of the probed batch (per replica) are scored (a
            positive ``int``; the attention scores cost B·N·T·S each).
    """

    layers: object = None
    every_n_steps: int = 1
    capture: tuple = CAPTURE_KINDS
    histograms: bool = True
    bucket_count: object = None
    histogram_buckets: object = None
    statistics: str = "default"
    instruments: tuple = ()
    outlier_sigmas: float = 6.0
    attention_examples: int = 4

    def __post_init__(self):
        _check_positive_int("every_n_steps", self.every_n_steps)
        if self.bucket_count is not None:
            _check_positive_int("bucket_count", self.bucket_count)
        object.__setattr__(
            self, "bucket_count", resolve_bucket_count(self.histogram_buckets, self.bucket_count)
        )
        if not isinstance(self.histograms, bool):
            raise TypeError(
                f"`histograms` must be True or False. Received: histograms={self.histograms!r}."
            )
        object.__setattr__(self, "capture", _check_kinds("capture", self.capture, CAPTURE_KINDS))
        check_statistics(self.statistics)
        object.__setattr__(self, "instruments", _check_instruments(self.instruments))
        _check_positive_number("outlier_sigmas", self.outlier_sigmas)
        _check_positive_int("attention_examples", self.attention_examples)

    def captures(self, kind):
        return kind in self.capture

    @property
    def schedule(self):
        """The `kgrad.plan.schedule.ProbeSchedule` of ``every_n_steps``: which steps are probed."""
        return ProbeSchedule(self.every_n_steps)


def check_tap_name(name):
    """Raises a TypeError unless ``name`` (of `kgrad.tap`) is a non-empty string.

    >>> check_tap_name("hidden")
    """
    if not isinstance(name, str) or not name:
        raise TypeError(
            "`name` must be a non-empty string naming the tapped tensor. "
            f"Received: name={name!r}. Example: kgrad.tap('hidden', x)."
        )


def _check_kinds(argument, value, allowed):
    """``value`` ("all" or kinds from ``allowed``) as a non-empty tuple of kinds."""
    kinds = allowed if isinstance(value, str) and value == "all" else value
    if isinstance(kinds, str) or not hasattr(kinds, "__iter__"):
        raise TypeError(
            f"`{argument}` must be 'all' or a list of {list(allowed)}. "
            f"Received: {argument}={value!r}."
        )
    kinds = tuple(kinds)
    unknown = [kind for kind in kinds if kind not in allowed]
    if unknown or not kinds:
        problem = f"it contains unknown kinds {unknown}" if unknown else "it is empty"
        raise ValueError(
            f"`{argument}` must be a non-empty subset of {list(allowed)}; {problem}. "
            f"Received: {argument}={value!r}."
        )
    return kinds


def check_statistics(value):
    """Raises a ValueError unless ``value`` is one of `STATISTICS`."""
    if not (isinstance(value, str) and value in STATISTICS):
        raise ValueError(
            f"`statistics` must be one of {list(STATISTICS)}. Received: statistics={value!r}. "
            "Use statistics='all' to write every moment and histogram of every tensor."
        )


def _check_instruments(value):
    if value is None:
        return ()
    if isinstance(value, str) or not hasattr(value, "__iter__") or any(v not in INSTRUMENTS for v in value):
        raise ValueError(
            f"`instruments` must be a list of {list(INSTRUMENTS)} (or empty). Received: "
            f"instruments={value!r}. Example: instruments=['optimizer', 'logits', 'attention']."
        )
    return tuple(value)


def _check_positive_number(argument, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(
            f"`{argument}` must be a positive number. Received: {argument}={value!r} "
            f"(type {type(value).__name__}). Example: {argument}=6."
        )


def _check_positive_int(argument, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"`{argument}` must be a positive int. Received: {argument}={value!r} "
            f"(type {type(value).__name__}). Example: {argument}=10."
        )


#: Tensor kinds the non-finite guard can watch.
GUARD_KINDS = (
    "inputs",
    "activations",
    "prediction_gradient",
    "activation_gradients",
    "weight_gradients",
)

#: The guard's default: with the loss, the weight gradients only, the
#: cheapest check that keeps every non-finite update out of the weights.
SENTINEL_KINDS = ("weight_gradients",)


@dataclasses.dataclass(frozen=True)
class GuardConfig:
    """Options of the non-finite check run on every step.

    Args:
        layers: Layers whose activations and dJ/d(activation) are checked;
            same forms as `ProbeConfig.layers`.
        watch: Subset of `GUARD_KINDS`, or ``"all"``. The default,
            `SENTINEL_KINDS`, checks the loss and the weight gradients only:
            what can reach the weights.
        ignore_loss_scale_skips: With a ``LossScaleOptimizer``, non-finite
            gradients are how the loss scaler finds its scale: the optimizer
            skips those steps itself. When True, only the forward pass is
            checked under loss scaling.
        halt_updates: After a trip, skip every later update of the same
            execution too (for actions that stop training).
        spikes: A `kgrad.plan.spike_rule.SpikeRule`: skip a step whose loss
            or gradient norm spikes, too (``None``: only non-finite steps).
    """

    layers: object = None
    watch: tuple = SENTINEL_KINDS
    ignore_loss_scale_skips: bool = True
    halt_updates: bool = True
    spikes: object = None

    def __post_init__(self):
        object.__setattr__(self, "watch", _check_kinds("watch", self.watch, GUARD_KINDS))

    def captures(self, kind):
        return kind in self.watch

    @property
    def checks_layers(self):
        """Whether layers' activations or dJ/d(activation) are checked (not by the sentinel)."""
        return self.captures("activations") or self.captures("activation_gradients")
