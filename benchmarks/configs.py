"""The benchmarked configurations and the issue's targets for them.

A configuration is what is added to a plain ``model.fit``: a list of
callbacks and the ``jit_compile`` setting. Each is compared with the baseline
of the same ``jit_compile`` setting, trained in the same process.
"""

import dataclasses

import kgrad
from benchmarks import peers

#: ``layers=`` given to kgrad: the issue asks for probing on all layers.
PROBE_LAYERS = "all"

BASELINE = "baseline"
BASELINE_XLA = "baseline_xla"
AA_CONTROL = "baseline_aa"


@dataclasses.dataclass(frozen=True)
class Config:
    """One benchmarked configuration.

    Attributes:
        name: Identifier used on the command line and in results.json.
        label: What it is, for RESULTS.md.
        family: ``"baseline"``, ``"kgrad"``, ``"guard"`` or ``"peer"``.
        jit_compile: Passed to ``model.compile``.
        every_n_steps: Probe period (1 when the config acts every step); the
            epoch length is a multiple of it so every epoch probes equally.
        make_callbacks: ``fn(log_dir, x_batch, y_batch) -> list`` of callbacks.
        time_target: Highest CPU-time ratio to the baseline the issue allows,
            or ``None`` where the issue sets none.
        memory_target: Highest peak-memory ratio allowed, or ``None``.
        quick: Whether ``--quick`` runs it (XLA compilation of the probed
            step takes minutes on 2 cores, too long for a smoke run).
    """

    name: str
    label: str
    family: str
    jit_compile: bool
    every_n_steps: int
    make_callbacks: object
    time_target: float = None
    memory_target: float = None
    quick: bool = True

    @property
    def baseline(self):
        """The configuration this one is compared with."""
        return BASELINE_XLA if self.jit_compile else BASELINE


def _no_callbacks(log_dir, x_batch, y_batch):
    return []


def _probe(
    every_n_steps, histograms, statistics="default", instruments=(), capture=None, histogram_buckets=None
):
    def make(log_dir, x_batch, y_batch):
        options = {} if capture is None else {"capture": capture}
        if histogram_buckets is not None:
            options["histogram_buckets"] = histogram_buckets
        return [
            kgrad.GradientProbe(
                log_dir,
                layers=PROBE_LAYERS,
                every_n_steps=every_n_steps,
                histograms=histograms,
                statistics=statistics,
                instruments=instruments,
                **options,
            )
        ]

    return make


def _guard(**options):
    def make(log_dir, x_batch, y_batch):
        return [kgrad.NonFiniteGuard(**options)]

    return make


def _guard_config(name, label, options, time_target, quick, jit_compile=False):
    return Config(
        name=name,
        label=label,
        family="guard",
        jit_compile=jit_compile,
        every_n_steps=1,
        make_callbacks=_guard(**options),
        time_target=time_target,
        memory_target=MEMORY_TARGET,
        quick=quick,
    )


def _tensorboard(log_dir, x_batch, y_batch):
    return [peers.tensorboard_peer(log_dir)]


def _extra_pass(every_n_steps):
    def make(log_dir, x_batch, y_batch):
        return [peers.ExtraPassGradientHistograms(log_dir, x_batch, y_batch, every_n_steps)]

    return make


# Targets of issue 7 (ratios to plain fit, same run).
#: Norms + histograms at every_n_steps=N: CPU ratio to the baseline.
TARGET_BY_N = {1: 1.25, 100: 1.03}
_NORMS_ONLY_TARGET = 1.10
_GUARD_TARGET = 1.05
#: Issue 22: per-example norms and noise-scale sums at every_n_steps=16.
_INSTRUMENTS_TARGET = 1.05
#: The options of the cheapest probe with the instruments.
INSTRUMENTS_ONLY = "capture=['weight_gradients'], histograms=False, instruments=['per_example']"
#: Issue 42: the stability instruments at every_n_steps=16, the logits and attention ones at every step.
_STABILITY_TARGET = 1.05
_LOGITS_EVERY_STEP_TARGET = 1.5
MEMORY_TARGET = 1.10
#: At the same N, kgrad's overhead must be at most this fraction of the
#: extra-pass peer's ("at least 2x cheaper").
PEER_OVERHEAD_FRACTION = 0.5


def _probe_configs(jit_compile):
    suffix, label = ("_xla", ", jit_compile=True") if jit_compile else ("", "")
    return [
        Config(
            name=f"probe{suffix}_n{n}",
            label=f"GradientProbe(layers='all', every_n_steps={n}), default statistics "
            f"(norms + gradient histograms){label}",
            family="kgrad",
            jit_compile=jit_compile,
            every_n_steps=n,
            make_callbacks=_probe(n, histograms=True),
            time_target=TARGET_BY_N.get(n),
            memory_target=MEMORY_TARGET,
            quick=not jit_compile,
        )
        for n in (1, 10, 100)
    ]


def _all_statistics_configs():
    """The full tag set (``statistics="all"``, the default before issue 23) at each N.

    No targets: compared with the default probe of the same N (``probe_n<N>``),
    each against plain ``fit`` in the same run. Not in ``--quick``.
    """
    return [
        Config(
            name=f"probe_all_n{n}",
            label=f"GradientProbe(layers='all', every_n_steps={n}, statistics='all'): "
            "every moment and histogram of every tensor",
            family="kgrad",
            jit_compile=False,
            every_n_steps=n,
            make_callbacks=_probe(n, histograms=True, statistics="all"),
            quick=False,
        )
        for n in (1, 10, 100)
    ]


def _instruments_only(every_n_steps, time_target):
    """The cheapest probe with the instruments (`INSTRUMENTS_ONLY`) at ``every_n_steps``."""
    return Config(
        name=f"probe_instruments_n{every_n_steps}",
        label=f"GradientProbe(layers='all', every_n_steps={every_n_steps}, {INSTRUMENTS_ONLY})",
        family="kgrad",
        jit_compile=False,
        every_n_steps=every_n_steps,
        make_callbacks=_probe(
            every_n_steps, histograms=False, instruments=["per_example"], capture=["weight_gradients"]
        ),
        time_target=time_target,
        memory_target=MEMORY_TARGET,
        quick=False,
    )


def _stability_only(name, every_n_steps, instruments, time_target):
    """Issue 42's instruments in the cheapest probe: the weight-gradient norms beside them, no histograms."""
    return Config(
        name=name,
        label=f"GradientProbe(layers='all', every_n_steps={every_n_steps}, capture=['weight_gradients'], "
        f"histograms=False, instruments={instruments})",
        family="kgrad",
        jit_compile=False,
        every_n_steps=every_n_steps,
        make_callbacks=_probe(
            every_n_steps, histograms=False, instruments=instruments, capture=["weight_gradients"]
        ),
        time_target=time_target,
        quick=False,
    )


def _plain(name, label, jit_compile=False):
    return Config(name, label, "baseline", jit_compile, 1, _no_callbacks, quick=not jit_compile)


def all_configs():
    """Every configuration, baselines first, in the order of RESULTS.md."""
    configs = [
        _plain(BASELINE, "plain model.fit"),
        _plain(AA_CONTROL, "plain model.fit again (A/A control)"),
        _plain(BASELINE_XLA, "plain model.fit, jit_compile=True", jit_compile=True),
    ]
    configs += _probe_configs(jit_compile=False) + _all_statistics_configs()
    configs += [
        Config(  # the histograms of earlier versions, beside probe_n1's log-magnitude ones (issue 53)
            name="probe_linear_n1",
            label="GradientProbe(layers='all', every_n_steps=1, histogram_buckets='linear')",
            family="kgrad",
            jit_compile=False,
            every_n_steps=1,
            make_callbacks=_probe(1, histograms=True, histogram_buckets="linear"),
            quick=False,
        )
    ]
    configs += _probe_configs(jit_compile=True)
    configs += [
        Config(
            name="probe_norms_n1",
            label="GradientProbe(layers='all', every_n_steps=1, histograms=False)",
            family="kgrad",
            jit_compile=False,
            every_n_steps=1,
            make_callbacks=_probe(1, histograms=False),
            time_target=_NORMS_ONLY_TARGET,
            memory_target=MEMORY_TARGET,
        ),
        # Issue 22's target: the instruments at every 16 steps, in the
        # cheapest probe that computes them (the weight-gradient norms beside
        # them, no histograms), as Cockpit's 1.04x is for its cheapest one.
        _instruments_only(16, time_target=_INSTRUMENTS_TARGET),
        # No target: the instruments beside the default statistics.
        Config(
            name="probe_instruments_full_n16",
            label="GradientProbe(layers='all', every_n_steps=16, instruments=['per_example']): "
            "default statistics and histograms too",
            family="kgrad",
            jit_compile=False,
            every_n_steps=16,
            make_callbacks=_probe(16, histograms=True, instruments=["per_example"]),
            quick=False,
        ),
        # Every step probed: `benchmarks.profile_ops` shows where the
        # instruments' time goes, and the peak memory of the instruments at
        # N=16 is measured here (N changes how often the probed step runs,
        # not what it allocates). No time target.
        _instruments_only(1, time_target=None),
        # Issue 42's targets: the three stability instruments at every 16
        # steps (<= 1.05), and the logits and attention instruments at every
        # step (<= 1.5), in their cheapest probe; the logits one alone at every
        # step (<= 1.5 too), to see what attention adds to it.
        _stability_only(
            "probe_stability_n16", 16, ["optimizer", "logits", "attention"], _STABILITY_TARGET
        ),
        _stability_only("probe_logits_n1", 1, ["logits"], _LOGITS_EVERY_STEP_TARGET),
        _stability_only(
            "probe_logits_attention_n1", 1, ["logits", "attention"], _LOGITS_EVERY_STEP_TARGET
        ),
        # No target: the same probe without instruments, what they are added to.
        _stability_only("probe_weight_norms_n16", 16, [], None),
        # The default guard: the every-step sentinel (the loss and the weight
        # gradients); the replay runs on a trip only, never in a timed run.
        _guard_config("guard", "NonFiniteGuard() alone: the sentinel (loss + weight gradients)", {},
                      _GUARD_TARGET, quick=True),
        # Issue 55: the guard that also skips spiking steps <= the guard + 0.01; no
        # target the harness can check (it compares with plain fit): read it against `guard`.
        # k = 1e6: the every-step cost of the rule is the same for any k, and at k = 6 the
        # benchmark MLP (random labels: its gradient norm rises as it memorizes) tripped
        # 3 skips in a row near step 385, which stops the timed fit.
        _guard_config("guard_skip_spikes",
                      "NonFiniteGuard(skip_spikes=True, spike_sigmas=1e6): compare with guard",
                      {"skip_spikes": True, "spike_sigmas": 1e6}, None, quick=False),
        # The same under XLA, against plain fit under XLA: what a GPU user
        # gets, since Keras' jit_compile="auto" compiles with XLA on a GPU
        # (not on a CPU-only machine).
        _guard_config("guard_xla", "NonFiniteGuard() alone, jit_compile=True", {}, _GUARD_TARGET,
                      quick=False, jit_compile=True),
        # No target of its own: the guard that checks every captured tensor on
        # every step (the default before the sentinel), for RESULTS.md.
        _guard_config(
            "guard_watch_all",
            "NonFiniteGuard(watch='all') alone: inputs, activations and gradients every step",
            {"watch": "all"},
            time_target=None,
            quick=False,
        ),
        # The second guard target: probe + guard <= probe alone + 0.05.
        # No target the harness can check (it compares with plain fit only):
        # read it against `probe_n10` of the same run.
        Config(
            name="probe_n10_guard",
            label="GradientProbe(layers='all', every_n_steps=10) + NonFiniteGuard(): compare with probe_n10",
            family="guard",
            jit_compile=False,
            every_n_steps=10,
            make_callbacks=lambda log_dir, x, y: (
                _probe(10, histograms=True)(log_dir, x, y) + _guard()(log_dir, x, y)
            ),
            time_target=None,
            memory_target=MEMORY_TARGET,
            quick=False,
        ),
        Config(
            name="tensorboard_peer",
            label="keras.callbacks.TensorBoard(histogram_freq=1): weight histograms per epoch",
            family="peer",
            jit_compile=False,
            every_n_steps=1,
            make_callbacks=_tensorboard,
        ),
    ]
    configs += [
        Config(
            name=f"extra_pass_n{n}",
            label=f"extra forward+backward GradientTape pass, gradient histograms every {n} steps",
            family="peer",
            jit_compile=False,
            every_n_steps=n,
            make_callbacks=_extra_pass(n),
        )
        for n in (1, 10, 100)
    ]
    return configs


def unavailable_reason(config):
    """Why ``config`` cannot run with this kgrad, or ``None`` when it can."""
    if config.family == "guard" and not hasattr(kgrad, "NonFiniteGuard"):
        return "kgrad.NonFiniteGuard does not exist in this kgrad version"
    return None


def select_configs(names=None, quick=False):
    """The configurations to run, with the baselines they are compared with.

    Args:
        names: Names to run (``None``: all, or all quick ones with ``quick``).
        quick: Keep only configurations marked ``quick`` when ``names`` is
            ``None``.

    Raises:
        ValueError: For an unknown name.
    """
    configs = all_configs()
    by_name = {config.name: config for config in configs}
    if names is None:
        chosen = {config.name for config in configs if config.quick or not quick}
    else:
        unknown = sorted(set(names) - set(by_name))
        if unknown:
            raise ValueError(
                f"Unknown configuration(s) {unknown}. Received: --configs={','.join(names)}. "
                f"Expected names among: {', '.join(by_name)}."
            )
        chosen = set(names)
    # The jit-off baseline is always run: it sizes the samples of every config.
    chosen |= {by_name[name].baseline for name in chosen} | {BASELINE}
    return [config for config in configs if config.name in chosen]


def peer_of(name):
    """The extra-pass peer at the same N as jit-off kgrad probe ``name``, or ``None``.

    >>> peer_of("probe_n10"), peer_of("probe_xla_n10"), peer_of("probe_norms_n1")
    ('extra_pass_n10', None, None)
    """
    period = name[len("probe_n") :]
    return f"extra_pass_n{period}" if name.startswith("probe_n") and period.isdigit() else None
