"""Writing results.json and RESULTS.md from a finished run."""

import json
import os

from benchmarks import timing
from benchmarks import targets as targets_module
from benchmarks.models import MODELS

METHOD = """\
- **Same process, interleaved.** Every configuration of a model trains a fresh
  copy of the model built under the same seed (identical initial weights),
  compiled once, on the same in-memory synthetic batches in the same order
  (an endless `tf.data` pipeline without prefetching or autotuning). Each runs ONE long
  `model.fit` in its own thread; the threads take turns epoch by epoch, so
  only one trains at a time (`benchmarks/interleave.py`). One `fit` per
  configuration keeps each sample free of setup: callbacks are created per
  configuration, and a first `fit` traces (with XLA, compiles) its step;
  that cost is excluded here, like Keras' own first trace.
- **Warm-up excluded.** Each configuration first runs {warmup} warm-up epoch(s)
  (tracing; its steps after the first two size the samples), untimed; once all
  are traced, one more untimed epoch each (a traced step's first call after other functions
  were added to TensorFlow's runtime costs more). "First step" in the tables
  is the CPU time from `fit`'s start to the end of its first step: setup,
  tracing and XLA compilation, paid by the first `fit` with these options
  (later `fit` calls of the same model reuse the traced step). A configuration
  whose warm-up steps after the first two (the second is the first call of
  Keras' own step, traced or compiled then when `every_n_steps` > 1) use
  more than {max_warmup:.0f} CPU-s is stopped and reported *too slow*, with its CPU ratio
  estimated from those steps (over whole probe periods) against the baseline's.
- **Samples.** {samples_text}
- **Pairs.** Configurations run in triplets around one baseline sample
  (config, baseline, config); odd rounds reverse the order, so each
  configuration alternates between running before and after its baseline.
  A configuration's ratio is the **median of its per-pair ratios**, over up
  to {pairs} pairs{budget_text}.
- **Headline: process CPU time** (`time.process_time()`, user + sys, all
  threads) per sample; wall time (`time.perf_counter()`) beside it, less
  reliable on shared machines. The **A/A control** (a second, identical
  plain model) is timed against the baseline the same way: its spread is
  the noise floor. "≈" marks a verdict whose margin is within that floor.
  The median's 95% interval (bootstrap over the pairs) says how far the
  median itself may be off: a verdict is clear only where it excludes the limit.
- **jit_compile.** Configurations with `jit_compile=True` are compared with a
  plain baseline compiled with `jit_compile=True`.
- **Peak memory** is the peak RSS (`VmHWM`) of a separate process per
  baseline and per kgrad configuration at `every_n_steps=1`
  (`python -m benchmarks.memory`: same model, data and callbacks,
  {mem_epochs} epoch(s), the same warm-up CPU budget), as a ratio to the
  baseline's process of the same `jit_compile`. N=10 and 100 run the same
  step graph and write less, so N=1 is the worst case. It includes
  TensorFlow's own footprint, as users' processes do. `results.json` also
  holds each process's peak and resident size when its first step ended
  and its resident size at the end: where the peak was reached.
- **Peers** (`benchmarks/peers.py`): Keras' `TensorBoard(histogram_freq=1)`
  (weight histograms once per epoch of {steps} steps, no gradients), and the
  extra-pass callback recommended in TensorFlow issues (a second eager
  `GradientTape` forward+backward pass on a fixed batch and
  `tf.summary.histogram` of every weight gradient, every N steps).
"""


def write_json(path, run):
    """Writes the whole run (settings, machine, every sample) as JSON."""
    with open(path, "w") as out:
        json.dump(run, out, indent=1, sort_keys=True, default=str)


def _fmt(value, digits=2):
    return "–" if value is None else f"{value:.{digits}f}"


def _ratio_cell(summary):
    if not summary:
        return "–"
    return f"{summary['median']:.3f} [{summary['q1']:.3f}–{summary['q3']:.3f}]"


def _machine_section(run):
    machine = run["machine"]
    rows = [
        (
            "CPU",
            f"{machine['cpu_model']}, {machine['logical_cpus']} logical CPUs "
            f"({machine['usable_cpus']} usable), {machine['memory_gib']} GiB RAM",
        ),
        ("GPU", ", ".join(machine["gpus"]) or "none (CPU only)"),
        (
            "Load average (1 min) at start / end",
            f"{machine['load_average_start']} / {machine.get('load_average_end')}",
        ),
        (
            "Software",
            f"Python {machine['python']}, TensorFlow {machine['tensorflow']}, "
            f"Keras {machine['keras']}, NumPy {machine['numpy']}, kgrad {machine['kgrad']}",
        ),
        (
            "kgrad source",
            f"commit {machine['git_commit']}"
            + (" + uncommitted changes in kgrad/" if machine["kgrad_uncommitted_changes"] else ""),
        ),
        ("Platform", machine["platform"]),
    ]
    lines = ["## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in rows]
    return lines


def _interval_cell(interval):
    return "–" if not interval else f"{interval[0]:.3f}–{interval[1]:.3f}"


def _targets_section(rows):
    lines = [
        "## Targets (issue 7)",
        "",
        "| model | target | config | limit | measured | median's 95% interval | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        verdict = "**FAIL**" if row["verdict"] == "FAIL" else row["verdict"]
        if row["within_noise"]:
            verdict += " ≈"
        how = "" if row["how"] == "measured" else f" ({row['how']})"
        lines.append(
            f"| {row['model']} | {row['target']} | `{row['config']}` | ≤ {row['limit']:.2f} | "
            f"{_fmt(row['value'], 3)}{how} | {_interval_cell(row.get('interval'))} | {verdict} |"
        )
    return lines


def _samples_text(settings, ks):
    if settings.get("sample_steps"):
        return (
            f"A sample is {settings['sample_steps']} steps (`--sample-steps`), ending in the middle\n"
            "  of an epoch: many short samples taken in turn share the machine's state. Their length\n"
            "  is a multiple of every `every_n_steps`, so every sample probes equally often."
        )
    return (
        f"A sample is {'/'.join(map(str, ks)) or '1'} whole epoch(s) of {settings['steps_per_epoch']} steps, "
        "so that the\n"
        f"  baseline's sample lasts at least {settings['sample_cpu']:.1f} CPU-s. The epoch length is a\n"
        "  multiple of every `every_n_steps`, so every sample probes equally often."
    )


def _model_section(name, model_run):
    spec = MODELS[name]
    lines = [f"### {name}: {spec.description}", ""]
    if model_run.get("error"):
        return lines + [f"Not measured: {model_run['error']}", ""]
    results = model_run["configs"]
    epochs = f"{model_run['steps_per_epoch']} steps"
    samples = (
        f"Samples of {model_run['sample_steps']} steps (ending mid-epoch; epochs of {epochs}). "
        if model_run.get("sample_steps")
        else f"Samples of {model_run['epochs_per_sample']} epoch(s) x {epochs}. "
    )
    lines += [
        samples
        + f"Baseline: {_fmt(results['baseline'].get('cpu_ms_per_step'))} CPU-ms per step"
        + (
            f"; with jit_compile=True: {_fmt(results['baseline_xla'].get('cpu_ms_per_step'))}"
            if "baseline_xla" in results
            else ""
        )
        + ".",
        "",
        "| config | what | pairs | CPU ratio, median [IQR] | wall ratio | peak memory ratio "
        "| first step, CPU-s | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config, result in results.items():
        if result["family"] == "baseline" and config != "baseline_aa":
            continue
        memory = targets_module.memory_ratio_of(results, config)
        cpu = _ratio_cell(result["cpu_ratio"])
        if result["status"] == "too_slow" and result.get("estimated_cpu_ratio") is not None:
            cpu = f"~{result['estimated_cpu_ratio']:.2f} (estimated)"
        wall = _fmt((result["wall_ratio"] or {}).get("median"), 3)
        note = result["note"] or ""
        lines.append(
            f"| `{config}` | {result['label']} | {len(result['pairs'])} | {cpu} | {wall} | "
            f"{_fmt(memory, 3)} | {_fmt(result.get('first_step_cpu'), 1)} | {note} |"
        )
    return lines + [""]


def _noise_section(run):
    lines = [
        "## Noise floor (A/A control: the baseline against an identical copy)",
        "",
        "| model | pairs | CPU ratio median | IQR | range | wall ratio median |",
        "|---|---|---|---|---|---|",
    ]
    for name, model_run in run["models"].items():
        aa = model_run.get("configs", {}).get("baseline_aa", {})
        cpu, wall = aa.get("cpu_ratio"), aa.get("wall_ratio")
        if not cpu:
            lines.append(f"| {name} | 0 | – | – | – | – |")
            continue
        lines.append(
            f"| {name} | {cpu['n']} | {cpu['median']:.3f} | {cpu['q1']:.3f}–{cpu['q3']:.3f} | "
            f"{cpu['min']:.3f}–{cpu['max']:.3f} | {_fmt(wall['median'], 3)} |"
        )
    return lines


def _budget_text(settings):
    if settings["config_budget"] is None:
        return ""
    return (
        f"; a configuration whose pairs would take more than {settings['config_budget']:.0f}"
        f" CPU-s gets fewer (at least {settings['min_pairs']}): its ratio is far above the noise."
        " The A/A control, and a configuration whose calibration ratio is at most"
        f" {timing.NEAR_TARGET:.2f} above its time target, get all pairs whatever they cost:"
        " the noise decides their verdicts"
    )


def write_markdown(path, run, target_rows, plot_name):
    """Writes RESULTS.md: verdicts first, then tables, plot and method."""
    settings = run["settings"]
    header = ["# kgrad benchmark results", ""]
    if run["mode"] == "quick":
        header += [
            "> **Quick smoke run**: few pairs, short epochs, XLA configurations left out.",
            "> Its ratios are not for quoting; run the full benchmark for those.",
            "",
        ]
    header += [
        f"Produced by `{run['command']}` (from the repository root) on {run['machine']['date']}, "
        f"in {run['duration_s'] / 60:.1f} minutes.",
        "",
    ]
    lines = (
        header + _targets_section(target_rows) + [""] + _noise_section(run) + ["", "## Results per model", ""]
    )
    for name, model_run in run["models"].items():
        lines += _model_section(name, model_run)
    lines += ["## Overhead vs every_n_steps", ""]
    lines += [
        f"![CPU-time overhead vs every_n_steps]({plot_name})"
        if plot_name
        else "No plot: matplotlib is not installed (`pip install -e .[bench]`).",
        "",
    ]
    ks = sorted({m["epochs_per_sample"] for m in run["models"].values() if "epochs_per_sample" in m})
    lines += [
        "## Method",
        "",
        METHOD.format(
            warmup=settings["warmup_epochs"],
            max_warmup=settings["max_warmup_cpu"],
            steps=settings["steps_per_epoch"],
            samples_text=_samples_text(settings, ks),
            pairs=settings["pairs"],
            budget_text=_budget_text(settings),
            mem_epochs=settings["warmup_epochs"],
        ),
    ]
    lines += _machine_section(run) + [""]
    with open(path, "w") as out:
        out.write("\n".join(lines))
    return os.path.abspath(path)
