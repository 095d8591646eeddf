"""The benchmark command: ``python -m benchmarks.run [--quick] [options]``.

Full run (on a quiet machine; 30-50 minutes on 2 cores with today's kgrad)::

    python -m benchmarks.run

writes ``benchmarks/RESULTS.md``, ``benchmarks/results.json`` and
``benchmarks/overhead.png``. ``--quick`` (CI smoke, under 2 minutes) runs the
MLP and the CNN with few short samples and writes to a temporary folder
unless ``--out-dir`` is given.
"""

import argparse
import dataclasses
import math
import os
import shlex
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import bench, configs, machine, memory, plot, report, targets  # noqa: E402
from benchmarks.models import MODELS  # noqa: E402

PRESETS = {
    "full": bench.Settings(
        steps_per_epoch=100,
        warmup_epochs=1,
        sample_cpu=1.0,
        pairs=11,
        min_pairs=5,
        config_budget=30.0,
        max_warmup_cpu=30.0,
    ),
    "quick": bench.Settings(
        steps_per_epoch=10,
        warmup_epochs=1,
        sample_cpu=0.0,
        pairs=3,
        min_pairs=3,
        config_budget=None,
        max_warmup_cpu=20.0,
    ),
}
DEFAULT_MODELS = {"full": ("mlp", "cnn", "mobilenet"), "quick": ("mlp", "cnn")}
#: The quick run measures memory for these only, on its first model.
QUICK_MEMORY_CONFIGS = (configs.BASELINE, "probe_n1")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _names(text):
    return [name.strip() for name in text.split(",") if name.strip()]


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="What kgrad's probing costs against plain model.fit and the peers.",
    )
    parser.add_argument("--quick", action="store_true", help="Smoke run (under 2 minutes).")
    parser.add_argument("--models", type=_names, help=f"Comma-separated, among {', '.join(MODELS)}.")
    parser.add_argument(
        "--configs", type=_names, help="Comma-separated config names (their baselines are added)."
    )
    parser.add_argument("--pairs", type=int, help="Timed pairs per config (full: 11).")
    parser.add_argument("--steps-per-epoch", type=int, help="Keep it a multiple of 100.")
    parser.add_argument("--sample-cpu", type=float, help="CPU-seconds of a baseline sample.")
    parser.add_argument(
        "--sample-steps",
        type=int,
        help="Samples of this many steps, ending mid-epoch, instead of whole epochs (--sample-cpu "
        "then does nothing); a multiple of every timed config's every_n_steps.",
    )
    parser.add_argument(
        "--config-budget",
        type=float,
        help="CPU-s of timed samples per config far above its target (full: 30); 0: no budget.",
    )
    parser.add_argument(
        "--max-warmup-cpu",
        type=float,
        help="CPU-s budget of a config's warm-up steps after the first two; past it, 'too slow'.",
    )
    parser.add_argument("--no-memory", action="store_true", help="Skip the peak-memory processes.")
    parser.add_argument("--jobs", type=int, default=2, help="Memory processes at a time.")
    parser.add_argument("--out-dir", help="Where RESULTS.md, results.json and overhead.png go.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models or ()) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; expected names among {', '.join(MODELS)}.")
    return args


def settings_from(args):
    """The preset of the mode, with the options given on the command line."""
    overrides = {
        "pairs": args.pairs,
        "steps_per_epoch": args.steps_per_epoch,
        "sample_cpu": args.sample_cpu,
        "sample_steps": args.sample_steps,
        "config_budget": args.config_budget,
        "max_warmup_cpu": args.max_warmup_cpu,
        "seed": args.seed,
    }
    preset = PRESETS["quick" if args.quick else "full"]
    settings = dataclasses.replace(preset, **{k: v for k, v in overrides.items() if v is not None})
    if settings.config_budget == 0:
        settings = dataclasses.replace(settings, config_budget=None)
    if settings.pairs < 1 or settings.steps_per_epoch < 1:
        raise SystemExit(f"--pairs and --steps-per-epoch must be >= 1. Received: {settings}.")
    return settings


def check_sample_steps(settings, chosen):
    """Exits with a message unless every sample of `Settings.sample_steps` probes equally often."""
    steps = settings.sample_steps
    if steps is None:
        return
    periods = sorted({config.every_n_steps for config in chosen})
    if steps < 1 or any(steps % period for period in periods):
        raise SystemExit(
            f"--sample-steps must be a positive multiple of every chosen config's every_n_steps "
            f"({', '.join(map(str, periods))}), so that every sample probes equally often. "
            f"Received: {steps}. Use --sample-steps {math.lcm(*periods)}, or fewer --configs."
        )


def _memory_plan(args, model_names, chosen):
    """``{model: [config names]}`` whose peak memory is measured.

    The baselines, and what has a memory target at ``every_n_steps=1``
    only: N changes how often the probed branch of the same step runs, not
    what is allocated, and N=1 writes the most; one XLA compilation of a
    probed MobileNet step takes minutes, so measuring N=10 and 100 too would
    add minutes for no information.
    """
    if args.no_memory:
        return {}
    names = [
        config.name
        for config in chosen
        if configs.unavailable_reason(config) is None
        and (
            config.name in (configs.BASELINE, configs.BASELINE_XLA)
            or (config.memory_target is not None and config.every_n_steps == 1)
        )
    ]
    if args.quick:
        return {model_names[0]: [name for name in QUICK_MEMORY_CONFIGS if name in names]}
    return {model: names for model in model_names}


def _attach_memory(run, measured):
    for model, by_config in measured.items():
        results = run["models"][model].get("configs", {})
        for name, value in by_config.items():
            if name in results:
                results[name]["memory"] = value


def _bench_models(run, model_names, chosen, settings, log_root):
    for name in model_names:
        bench_run = bench.ModelBench(MODELS[name], chosen, settings, log_root, say=_say)
        try:
            results = bench_run.run()
        except Exception as error:  # one model's failure must not lose the others
            run["models"][name] = {"error": f"{type(error).__name__}: {error}"}
            _say(f"[{name}] FAILED: {run['models'][name]['error']}")
            continue
        run["models"][name] = {
            "configs": results,
            "epochs_per_sample": bench_run.epochs_per_sample,
            "sample_steps": settings.sample_steps,
            "steps_per_epoch": settings.steps_per_epoch,
        }


def _say(text):
    print(text, flush=True)


def main(argv=None):
    """Runs the benchmark; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    settings = settings_from(args)
    model_names = list(args.models or DEFAULT_MODELS[mode])
    chosen = configs.select_configs(args.configs, quick=args.quick)
    check_sample_steps(settings, chosen)
    out_dir = args.out_dir or (
        os.path.join(tempfile.gettempdir(), "kgrad-bench-quick") if args.quick else _HERE
    )
    os.makedirs(out_dir, exist_ok=True)
    started = time.perf_counter()
    run = {
        "mode": mode,
        "command": shlex.join(["python", "-m", "benchmarks.run", *argv]),
        "machine": machine.describe(),
        "settings": dataclasses.asdict(settings),
        "models": {},
    }
    _say(
        f"kgrad benchmark ({mode}): models {', '.join(model_names)}; "
        f"configs {', '.join(config.name for config in chosen)}"
    )
    with tempfile.TemporaryDirectory(prefix="kgrad-bench-logs-") as log_root:
        _bench_models(run, model_names, chosen, settings, log_root)
        plan = _memory_plan(args, model_names, chosen)
        if plan:
            _attach_memory(run, memory.measure_all(args.jobs, plan, settings, log_root, say=_say))
    return _write_outputs(run, out_dir, started)


def _write_outputs(run, out_dir, started):
    run["machine"]["load_average_end"] = machine.load_average()
    run["duration_s"] = time.perf_counter() - started
    rows = [
        row
        for name, model_run in run["models"].items()
        for row in targets.judge(name, model_run.get("configs", {}))
    ]
    run["targets"] = rows
    plot_path = os.path.join(out_dir, "overhead.png")
    title = f"kgrad overhead ({run['mode']} run, {run['machine']['cpu_model']})"
    drawn = plot.draw(plot_path, run["models"], title)
    if not drawn:
        _say("note: matplotlib is not installed, no plot drawn (pip install -e .[bench]).")
    report.write_json(os.path.join(out_dir, "results.json"), run)
    markdown = report.write_markdown(
        os.path.join(out_dir, "RESULTS.md"), run, rows, "overhead.png" if drawn else None
    )
    _print_targets(rows)
    _say(
        f"wrote {markdown} (+ results.json{', overhead.png' if drawn else ''}) "
        f"in {run['duration_s'] / 60:.1f} min"
    )
    return 0 if all(model_run.get("configs") for model_run in run["models"].values()) else 1


def _print_targets(rows):
    for row in rows:
        value = "–" if row["value"] is None else f"{row['value']:.3f}"
        noise = " (within noise)" if row["within_noise"] else ""
        _say(
            f"  {row['model']:<9} {row['config']:<16} {row['target']:<28} "
            f"{value:>7} <= {row['limit']:.2f}: {row['verdict']}{noise}"
        )


if __name__ == "__main__":
    sys.exit(main())
