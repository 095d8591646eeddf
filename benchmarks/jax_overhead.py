"""What probing costs on Keras' JAX backend: plain ``fit`` against ``fit`` with a `kgrad.GradientProbe`.

Run with ``KERAS_BACKEND=jax python -m benchmarks.jax_overhead [--models mlp,cnn] [--pairs 11]``.
Every configuration is a model of its own, built with the same weights, compiled
and warmed up (tracing and XLA compiles excluded) in one process, then timed in
interleaved pairs against plain ``fit`` on the same batches: the median of the
per-pair CPU-time ratios (wall time beside it), with an A/A control
(shared/BENCHMARKING.md). Besides kgrad's configurations:

- ``floor_perturb_n1``: the one-pass floor of getting dJ/d(activation) at all, every
  step: Keras' step differentiated with respect to the weights *and* a zero
  perturbation added to each captured layer output (Flax's ``perturb``), nothing
  computed from it (the perturbation gradients are only summed, so they are kept).
- ``perturb_n1``: the same, with kgrad's statistics of dJ/d(activation) computed from
  the perturbation gradients, against ``carrier_n1``: kgrad's probe computing the same
  statistics through its carriers (in the backward pass, no buffer the size of the
  activation), without writing logs.
- ``guard``: a `kgrad.NonFiniteGuard` (its sentinel every step).
- ``guard_floor``: the least any guard that keeps a bad step's update out
  costs: Keras' step with one sum of squares of the loss and of each weight
  gradient, and the update in a ``lax.cond`` on their finiteness (no record,
  nothing on the host).
- ``floor_one_pass_n1`` / ``floor_one_pass_n10``: the one-pass floor of the
  probe, as `benchmarks.probe_floor` measures it on TensorFlow: kgrad's
  `GradientProbe` at ``every_n_steps`` 1 / 10, everything as it is (capture,
  weight norms and update ratios, the record read back and written to the event
  file every probed step) except its statistics, replaced while the step is
  traced by one reduction (the max) over every captured element: the least
  that any implementation of them reads. Their numbers are wrong by design:
  they are for timing only. The target "every step ≤ 1.2 × the one-pass floor"
  compares ``probe_n1`` with ``floor_one_pass_n1``.
- ``floor_read_once_n1`` / ``floor_read_once_n10``: the same with one sum per
  captured tensor (issue 53's read-once floor; "every step ≤ 1.15 × the floor").
- ``floor_histograms_n1`` / ``floor_histograms_n10``: the one-pass floor with the histograms the probe
  writes (twelve on the MLP), each at its cheapest: a min (the max is the
  floor's), the bucket index and one scatter. A histogram between the
  min and the max cannot be counted in the pass that finds them, so this is the
  floor of any probe that writes them.

With ``--memory``, each of baseline, probe_n1, probe_n10, guard and the two floors also trains in a
process of its own (``--memory-child``) and reports its peak resident memory (``VmHWM``,
as benchmarks/memory.py does); the ratios are to the baseline process's.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import keras

import kgrad
from benchmarks import jax_floors
from benchmarks.models import MODELS, build_model, make_data

CONFIGS = (
    "baseline_aa",
    "probe_n100",
    "probe_n10",
    "probe_n1",
    "probe_linear_n1",
    "guard",
    "guard_floor",
    "floor_one_pass_n10",
    "floor_one_pass_n1",
    "floor_read_once_n10",
    "floor_read_once_n1",
    "floor_histograms_n10",
    "floor_histograms_n1",
    "floor_perturb_n1",
    "perturb_n1",
    "carrier_n1",
)


class _SwapTrainFunction(keras.callbacks.Callback):
    """Runs a model's fit with ``step`` (jitted) as its train function, one step per execution."""

    def __init__(self, step):
        super().__init__()
        self._step = jax.jit(step, donate_argnums=0)

    def on_train_begin(self, logs=None):
        step = self._step
        self.model.train_function = lambda state, iterator: step(state, next(iterator))


def _callbacks(config, log_dir):
    if config == "guard":
        return [kgrad.NonFiniteGuard()]
    if config == "carrier_n1":  # what perturb_n1 computes, through kgrad's carriers
        return [kgrad.GradientProbe(None, capture=["activation_gradients"], every_n_steps=1)]
    if config == "probe_linear_n1":  # earlier versions' histograms, beside probe_n1's log-magnitude ones
        return [kgrad.GradientProbe(log_dir, every_n_steps=1, histogram_buckets="linear")]
    if config.startswith(("probe_n", "floor_one_pass_n", "floor_histograms_n", "floor_read_once_n")):
        return [kgrad.GradientProbe(log_dir, every_n_steps=int(config.rpartition("_n")[2]))]
    return []


def _model(spec, config, seed):
    model = build_model(spec, seed, jit_compile=True)
    if config in ("floor_perturb_n1", "perturb_n1"):
        model.build(input_shape=(None, *spec.input_shape))
    return model


def _fit(model, callbacks, x, y, spec):
    start_cpu, start_wall = time.process_time(), time.perf_counter()
    model.fit(x, y, batch_size=spec.batch_size, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return time.process_time() - start_cpu, time.perf_counter() - start_wall


def run_model(spec, pairs, steps, seed=0, configs=CONFIGS):
    x, y = make_data(spec, steps, seed)
    log_root = tempfile.mkdtemp(prefix="kgrad-jax-bench-")
    models, callbacks = {}, {}
    for config in ("baseline",) + tuple(configs):
        models[config] = _model(spec, config, seed)
        callbacks[config] = _callbacks(config, os.path.join(log_root, config))
        if config in ("floor_perturb_n1", "perturb_n1"):
            step = jax_floors.perturbed_step(models[config], config == "perturb_n1")
            callbacks[config] = [_SwapTrainFunction(step)]
        if config == "guard_floor":
            callbacks[config] = [_SwapTrainFunction(jax_floors.guard_floor_step(models[config]))]
        # The warm-up fit traces and compiles the probed step: a floor's with its stand-in statistics.
        with jax_floors.stand_in_statistics(config):
            _fit(models[config], callbacks[config], x[: spec.batch_size * 2], y[: spec.batch_size * 2], spec)
    results = {}
    for config in configs:
        cpu_ratios, wall_ratios, baseline_wall = [], [], []
        for pair in range(pairs):
            order = (config, "baseline") if pair % 2 else ("baseline", config)
            times = {name: _fit(models[name], callbacks[name], x, y, spec) for name in order}
            cpu_ratios.append(times[config][0] / times["baseline"][0])
            wall_ratios.append(times[config][1] / times["baseline"][1])
            baseline_wall.append(times["baseline"][1])
        results[config] = {
            "cpu_ratio": statistics.median(cpu_ratios),
            "wall_ratio": statistics.median(wall_ratios),
            "baseline_ms_per_step": statistics.median(baseline_wall) / steps * 1e3,
            "cpu_ratios": cpu_ratios,
            "wall_ratios": wall_ratios,
        }
        result = results[config]
        print(
            f"  {spec.name:9s} {config:18s} CPU ratio {result['cpu_ratio']:.3f} "
            f"[{min(cpu_ratios):.3f}-{max(cpu_ratios):.3f}]  wall ratio {result['wall_ratio']:.3f} "
            f"[{min(wall_ratios):.3f}-{max(wall_ratios):.3f}]  "
            f"plain fit {result['baseline_ms_per_step']:.2f} ms/step",
            flush=True,
        )
    return results


MEMORY_CONFIGS = (
    "baseline", "probe_n1", "probe_n10", "guard",
    "floor_one_pass_n1", "floor_histograms_n1", "floor_histograms_n10", "floor_read_once_n1",
)


def _peak_resident_bytes():
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def memory_child(spec, config, steps, seed=0):
    """Trains ``config`` for ``steps`` steps in this process; prints its peak resident memory (JSON)."""
    x, y = make_data(spec, steps, seed)
    model = _model(spec, config, seed)
    log_dir = tempfile.mkdtemp(prefix="kgrad-jax-memory-")
    with jax_floors.stand_in_statistics(config):
        model.fit(x, y, batch_size=spec.batch_size, epochs=2, shuffle=False, verbose=0,
                  callbacks=_callbacks(config, log_dir))
    print(json.dumps({"config": config, "peak_bytes": _peak_resident_bytes()}))


def measure_memory(spec, steps):
    """``{config: {"peak_mb", "ratio"}}``, each config in a fresh process (a peak only grows)."""
    peaks = {}
    for config in MEMORY_CONFIGS:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.jax_overhead", "--models", spec.name,
             "--steps", str(steps), "--memory-child", config],
            capture_output=True, text=True, check=True, timeout=900,
        )
        peaks[config] = json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]
    results = {}
    for config in MEMORY_CONFIGS:
        results[config] = {"peak_mb": peaks[config] / 2**20, "ratio": peaks[config] / peaks["baseline"]}
        print(f"  {spec.name:9s} {config:18s} peak memory {results[config]['peak_mb']:.0f} MB, "
              f"ratio {results[config]['ratio']:.3f}", flush=True)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn", help="Comma-separated, among mlp, cnn, mobilenet.")
    parser.add_argument("--pairs", type=int, default=11, help="Timed pairs per configuration.")
    parser.add_argument("--steps", type=int, default=100, help="Steps per timed fit (one sample).")
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"Comma-separated, among {', '.join(CONFIGS)}."
    )
    parser.add_argument("--out", default=None, help="Write the results as JSON to this file.")
    parser.add_argument("--memory", action="store_true", help="Also measure peak memory per configuration.")
    parser.add_argument("--memory-child", default=None, choices=MEMORY_CONFIGS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if keras.config.backend() != "jax":
        parser.error(f"run with KERAS_BACKEND=jax (Keras runs on {keras.config.backend()!r}).")
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; expected some of {sorted(MODELS)}.")
    configs = args.configs.split(",")
    unknown_configs = sorted(set(configs) - set(CONFIGS))
    if unknown_configs:
        parser.error(f"--configs: unknown {unknown_configs}; expected some of {list(CONFIGS)}.")
    if args.memory_child:
        return memory_child(MODELS[args.models.split(",")[0]], args.memory_child, args.steps)
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {jax.devices()[0].device_kind}"
    )
    print(
        f"kgrad on JAX {jax.__version__}, Keras {keras.__version__}; {machine}; {args.pairs} pairs of "
        f"{args.steps} steps",
        flush=True,
    )
    results = {
        name: run_model(MODELS[name], args.pairs, args.steps, configs=configs)
        for name in args.models.split(",")
    }
    if args.memory:
        for name in args.models.split(","):
            results[name]["memory"] = measure_memory(MODELS[name], args.steps)
    if args.out:
        with open(args.out, "w") as file:
            json.dump(
                {"machine": machine, "pairs": args.pairs, "steps": args.steps, "results": results},
                file,
                indent=1,
            )


if __name__ == "__main__":
    main()
