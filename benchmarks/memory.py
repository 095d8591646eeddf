"""Peak memory per configuration, each measured in a process of its own.

A process's peak resident set size only ever grows, so one process cannot
measure several configurations: each runs ``python -m benchmarks.memory``
(this module), which builds the same model, data and callbacks as the timing
run, trains ``epochs`` epochs (the first traces) and prints its peak RSS as
one JSON line. Ratios are taken to the baseline's process.

The peak is ``VmHWM`` from ``/proc/self/status``, not ``ru_maxrss``: Linux
carries ``ru_maxrss`` across ``fork`` + ``exec``, so every child would report
at least the benchmark parent's own (large) footprint.
"""

import argparse
import concurrent.futures
import json
import os
import resource
import subprocess
import sys
import time

import keras

from benchmarks.interleave import SETUP_STEPS

#: Longest a memory process may run (seconds).
_PROCESS_TIMEOUT = 900
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child_command(model, config, steps_per_epoch, epochs, max_cpu, seed, log_dir):
    return [
        sys.executable,
        "-m",
        "benchmarks.memory",
        "--model",
        model,
        "--config",
        config,
        "--steps-per-epoch",
        str(steps_per_epoch),
        "--epochs",
        str(epochs),
        "--max-cpu",
        str(max_cpu),
        "--seed",
        str(seed),
        "--log-dir",
        log_dir,
    ]


def _run_child(command):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        done = subprocess.run(
            command,
            cwd=_REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=_PROCESS_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {_PROCESS_TIMEOUT} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    return json.loads(lines[-1])


def measure_all(jobs, model_configs, settings, log_root, say=print):
    """Peak RSS of every ``(model, config)``, ``jobs`` processes at a time.

    Args:
        jobs: Processes run at once (peak RSS is per process, so running
            them side by side changes only how long this takes).
        model_configs: ``{model name: [config names]}``.
        settings: The run's `benchmarks.bench.Settings`.
        log_root: Folder for the processes' TensorBoard logs.

    Returns:
        ``{model: {config: {"maxrss_mb": ..., ...} or {"error": ...}}}``.
    """
    commands = {
        (model, config): _child_command(
            model,
            config,
            settings.steps_per_epoch,
            settings.warmup_epochs,
            settings.max_warmup_cpu,
            settings.seed,
            os.path.join(log_root, "memory", model, config),
        )
        for model, names in model_configs.items()
        for config in names
    }
    results = {model: {} for model in model_configs}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(_run_child, command): key for key, command in commands.items()}
        for future in concurrent.futures.as_completed(futures):
            model, config = futures[future]
            results[model][config] = future.result()
            shown = results[model][config].get("maxrss_mb", results[model][config].get("error"))
            say(f"[{model}] peak memory {config}: {shown}")
    return results


def peak_rss_mib():
    """This process's peak resident set size in MiB (``VmHWM``)."""
    peak = _status_mib("VmHWM:")
    if peak is not None:
        return peak
    # Not Linux: ru_maxrss is the best there is (KiB on Linux, bytes on macOS).
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024


def _status_mib(*fields):
    """``/proc/self/status`` sizes in MiB (``"VmHWM:"``, ``"VmRSS:"``), or ``None`` off Linux.

    Several fields come from one read: read one after the other, the resident
    size could grow past the peak read a moment before.
    """
    values = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(fields):
                    values[line.split()[0]] = int(line.split()[1]) / 1024
    except OSError:
        return None if len(fields) == 1 else (None,) * len(fields)
    found = tuple(values.get(field) for field in fields)
    return found[0] if len(fields) == 1 else found


class _FirstStepMemory(keras.callbacks.Callback):
    """The peak and resident sizes when the first step ends.

    The first step traces the step function and builds its runtime (graph
    optimization, kernels): when the process's peak equals the first step's,
    that is where it was reached, and the resident size after it says how
    much of it stays.
    """

    def __init__(self):
        super().__init__()
        self.peak_mb = self.rss_mb = None

    def on_train_batch_end(self, batch, logs=None):
        if self.peak_mb is None:
            self.peak_mb, self.rss_mb = _status_mib("VmHWM:", "VmRSS:")


class _CpuLimit(keras.callbacks.Callback):
    """Counts steps; stops training once the steps after the setup used ``seconds``.

    As in the timing run, the budget starts after `SETUP_STEPS` steps.
    """

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds
        self.steps = 0
        self._setup_end = None

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        now = time.process_time()
        if self.steps == SETUP_STEPS:
            self._setup_end = now
        elif self._setup_end is not None and now - self._setup_end > self.seconds:
            self.model.stop_training = True


def _main(argv=None):
    parser = argparse.ArgumentParser(description="Peak RSS of one benchmark configuration.")
    for name, kind in (
        ("--model", str),
        ("--config", str),
        ("--steps-per-epoch", int),
        ("--epochs", int),
        ("--max-cpu", float),
        ("--seed", int),
        ("--log-dir", str),
    ):
        parser.add_argument(name, type=kind, required=True)
    args = parser.parse_args(argv)

    from benchmarks import bench, configs, models

    spec = models.MODELS[args.model]
    config = {c.name: c for c in configs.all_configs()}[args.config]
    settings = bench.Settings(args.steps_per_epoch, args.epochs - 1, 0.0, 1, 1, None, args.max_cpu, args.seed)
    inputs = bench.make_inputs(spec, settings)
    model, callbacks = bench.prepare(spec, config, settings, inputs, args.log_dir)
    limit, first_step = _CpuLimit(args.max_cpu), _FirstStepMemory()
    model.fit(
        inputs[2],
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        verbose=0,
        shuffle=False,
        callbacks=[*callbacks, limit, first_step],
    )
    end_rss = _status_mib("VmRSS:")  # before the peak, which cannot then be below it
    report = {
        "maxrss_mb": peak_rss_mib(),
        "steps": limit.steps,
        "stopped_early": bool(model.stop_training),
        "first_step_peak_mb": first_step.peak_mb,
        "first_step_end_rss_mb": first_step.rss_mb,
        "end_rss_mb": end_rss,
        # Of the resident size at the end: anonymous memory, and pages of files
        # (shared libraries' code, such as XLA's compiler once a function is compiled).
        "end_anon_mb": _status_mib("RssAnon:"),
        "end_file_mb": _status_mib("RssFile:"),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    _main()
