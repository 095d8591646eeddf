"""The overhead-vs-every_n_steps plot (PNG), drawn with matplotlib if installed."""

from benchmarks import configs
from benchmarks import targets as targets_module

_PERIODS = (1, 10, 100)
#: (config name prefix, legend label, line style)
_SERIES = (
    ("probe_n", "kgrad, default statistics", "-"),
    ("probe_all_n", "kgrad, statistics='all'", "-."),
    ("probe_xla_n", "kgrad, default statistics, XLA", "--"),
    ("extra_pass_n", "extra-pass peer", ":"),
)


def overhead_series(models):
    """``[(model, label, style, [(N, overhead %), ...])]`` for every measured line."""
    series = []
    for model, model_run in models.items():
        results = model_run.get("configs", {})
        for prefix, label, style in _SERIES:
            points = []
            for period in _PERIODS:
                ratio, _ = targets_module.cpu_ratio_of(results.get(f"{prefix}{period}"))
                if ratio is not None:
                    points.append((period, 100.0 * (ratio - 1.0)))
            if points:
                series.append((model, label, style, points))
    return series


def draw(path, models, title):
    """Draws the plot to ``path``; returns False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on benchmark machines
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, axes = plt.subplots(figsize=(10, 5), dpi=120)
    colors = {}
    for model, label, style, points in overhead_series(models):
        color = colors.setdefault(model, f"C{len(colors)}")
        xs, ys = zip(*points)
        axes.plot(xs, ys, style, marker="o", color=color, label=f"{model}: {label}")
    for period, ratio in configs.TARGET_BY_N.items():
        overhead = 100.0 * (ratio - 1.0)
        axes.plot([period], [overhead], "k_", markersize=30, markeredgewidth=2)
        axes.annotate(f"≤ {overhead:.0f}%", (period, overhead), textcoords="offset points", xytext=(18, -4))
    axes.plot([], [], "k_", markersize=12, markeredgewidth=2, label="kgrad target (issue 7)")
    axes.set_xscale("log")
    # Overheads span 1% to several 100%: symlog keeps both ends readable.
    axes.set_yscale("symlog", linthresh=1.0)
    # Below zero is noise (a config cheaper than plain fit); keep it small.
    axes.set_ylim(bottom=-5.0)
    axes.set_xticks(_PERIODS, [str(period) for period in _PERIODS])
    axes.set_xlabel("every_n_steps")
    axes.set_ylabel("CPU-time overhead vs plain fit (%)")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True
