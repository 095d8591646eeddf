"""What a probe at ``every_n_steps=N`` costs, from the CPU time of each step.

`benchmarks.run` times whole samples of 100-200 steps against plain ``fit``;
on these shared machines its A/A control spreads by several percent, as wide
as the 1.03 target at N=100, so that verdict flips between runs. Here every
step is timed on its own inside long fits (the process CPU time between
consecutive ``on_train_batch_end`` calls of a callback that runs last, so
kgrad's callbacks and Keras' loop are in it), and the cost of N steps is
estimated from the median of each kind of step, which a core vanishing for
a second moves little::

    ratio(N) = ((N - 1) * plain + probed) / (N * baseline)

``plain``: the median step of the probed ``fit`` that is not probed (Keras'
own function, plus kgrad's callbacks); ``probed``: the median probed step,
its record read and written included; ``baseline``: the median step of plain
``fit`` on an identical model, in the same process, the fits interleaved.
Each round also gives this estimate from its own steps and the whole-``fit``
CPU ratio (`benchmarks.run`'s kind of figure), to show their spread.

Run (30 s wall for the MLP at N=100, measured; the three models with and
without XLA took 11 minutes one after another: each is the warm-up of two
models and their ``rounds`` fits of ``steps`` steps)::

    python -m benchmarks.step_cost --model mlp --every 100
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402
from benchmarks import configs  # noqa: E402
from benchmarks.models import MODELS, build_model, make_data, make_dataset  # noqa: E402


class Stamps(keras.callbacks.Callback):
    """Process CPU time at each batch hook and at the epoch's start.

    Two of them around kgrad's callback time its hooks; the last one in
    ``callbacks`` also times the steps (from the previous step's end, or the
    epoch's start, to this step's end).
    """

    def __init__(self):
        super().__init__()
        self.epoch_start = None
        self.begins = []
        self.ends = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_start = time.process_time()

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.process_time())

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.process_time())

    def step_seconds(self):
        ends = np.asarray(self.ends)
        return np.diff(ends, prepend=self.epoch_start)

    def seconds_since(self, earlier):
        """Per step: the time between ``earlier``'s hooks and this one's, begin and end."""
        return (np.asarray(self.begins) - earlier.begins) + (np.asarray(self.ends) - earlier.ends)


def estimate(plain, probed, baseline, every_n_steps):
    """``((N - 1) * plain + probed) / (N * baseline)``, from step times in seconds.

    >>> round(estimate([1.0, 1.0], [3.0], [1.0, 1.0], 100), 3)
    1.02
    """
    n = every_n_steps
    plain_part = (n - 1) * float(np.median(plain)) if n > 1 else 0.0
    return (plain_part + float(np.median(probed))) / (n * float(np.median(baseline)))


def _timed_fit(model, dataset, steps, callbacks):
    """``(step seconds, kgrad's hook seconds per step, whole fit's CPU seconds)``."""
    before, after = Stamps(), Stamps()
    start = time.process_time()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0,
              callbacks=[before, *callbacks, after])
    return after.step_seconds(), after.seconds_since(before), time.process_time() - start


def measure(model_name, every_n_steps, rounds, steps, jit_compile=False, probe_options=None, guard=False):
    """Per-step CPU times of plain ``fit`` and of a probed one, interleaved.

    Args:
        model_name: A key of `benchmarks.models.MODELS`.
        every_n_steps: The probe's N; ``steps`` must be a multiple of it.
        rounds: Interleaved pairs of fits (the order alternates).
        steps: Steps per fit.
        jit_compile: Passed to ``model.compile`` for both models.
        probe_options: More keyword arguments of the `kgrad.GradientProbe`.
        guard: Also a `kgrad.NonFiniteGuard()` on the probed fit: its plain
            steps are then the guard's own function, its probed steps the
            probe's with the guard's check.

    Returns:
        A dict: ``plain``, ``probed`` and ``baseline`` step times, and the
        window between the stamps around kgrad's callback in each plain step
        (``hooks``) and in plain fit (``baseline_hooks``), in seconds, every
        round pooled; ``kgrad_hooks``: the difference of their medians;
        ``ratio``: `estimate` against the baseline's steps;
        ``within_fit_ratio``: `estimate` against the probed fit's own plain
        steps less ``kgrad_hooks`` (Keras' own function: what plain ``fit``
        runs), which the machine's speed, drifting between fits, cannot
        move; per round, ``round_ratios`` (the first estimate) and
        ``fit_ratios`` (whole-``fit`` CPU time, probed over plain).
    """
    if steps % every_n_steps:
        raise ValueError(
            f"`steps` must be a multiple of `every_n_steps` so that every fit probes "
            f"equally often. Received: steps={steps}, every_n_steps={every_n_steps}."
        )
    spec = MODELS[model_name]
    x, y = make_data(spec, min(50, steps), seed=0)
    dataset = make_dataset(spec, x, y)
    probed_mask = np.arange(steps) % every_n_steps == 0
    with tempfile.TemporaryDirectory(prefix="kgrad-step-cost-") as log_dir:
        probe = kgrad.GradientProbe(
            log_dir, layers=configs.PROBE_LAYERS, every_n_steps=every_n_steps, **(probe_options or {})
        )
        guards = [kgrad.NonFiniteGuard()] if guard else []
        runs = {
            "baseline": (build_model(spec, 0, jit_compile), []),
            "probe": (build_model(spec, 0, jit_compile), [probe, *guards]),
        }
        for model, callbacks in runs.values():
            # Tracing (and XLA compiling) both functions, outside the timing.
            model.fit(dataset, steps_per_epoch=max(2 * every_n_steps, 20), epochs=1,
                      verbose=0, callbacks=callbacks)
        times = {"plain": [], "probed": [], "baseline": [], "hooks": [], "baseline_hooks": []}
        round_ratios, fit_ratios = [], []
        for round_index in range(rounds):
            order = ["baseline", "probe"] if round_index % 2 == 0 else ["probe", "baseline"]
            measured = {}
            for name in order:
                model, callbacks = runs[name]
                measured[name] = _timed_fit(model, dataset, steps, callbacks)
            probe_steps, hooks, probe_cpu = measured["probe"]
            base_steps, base_hooks, base_cpu = measured["baseline"]
            round_times = {
                "plain": probe_steps[~probed_mask],
                "probed": probe_steps[probed_mask],
                "baseline": base_steps,
            }
            for name, values in round_times.items():
                times[name].extend(values.tolist())
            times["hooks"].extend(hooks[~probed_mask].tolist())
            times["baseline_hooks"].extend(base_hooks.tolist())
            round_ratios.append(estimate(**round_times, every_n_steps=every_n_steps))
            fit_ratios.append(probe_cpu / base_cpu)
    times = {name: np.asarray(values) for name, values in times.items()}
    # What kgrad's hooks add to a plain step: the window between the two
    # stamps, less the same window in plain fit (the stamps' own calls, and
    # TensorFlow's threads finishing the step while the hooks run).
    kgrad_hooks = float(np.median(times["hooks"]) - np.median(times["baseline_hooks"]))
    return {
        "kgrad_hooks": kgrad_hooks,
        **times,
        "ratio": estimate(times["plain"], times["probed"], times["baseline"], every_n_steps),
        "within_fit_ratio": estimate(
            times["plain"], times["probed"], times["plain"] - kgrad_hooks, every_n_steps
        ),
        "round_ratios": round_ratios,
        "fit_ratios": fit_ratios,
    }


def describe(model_name, every_n_steps, result):
    """Lines for the terminal."""

    def ms(values):
        return f"{1000 * float(np.median(values)):.2f}" if len(values) else "-"

    def spread(values):
        return f"median {np.median(values):.3f}, range {min(values):.3f}-{max(values):.3f}"

    return "\n".join(
        [
            f"{model_name}, every_n_steps={every_n_steps}: median CPU-ms per step: "
            f"baseline {ms(result['baseline'])}, plain (probed fit) {ms(result['plain'])}, "
            f"probed {ms(result['probed'])} ({len(result['probed'])} probed steps); "
            f"kgrad's hooks add {1e6 * result['kgrad_hooks']:.0f} CPU-us to a plain step",
            f"  estimated ratio to plain fit: {result['ratio']:.3f} against the baseline's steps, "
            f"{result['within_fit_ratio']:.3f} within the probed fit",
            f"  per round: estimate {spread(result['round_ratios'])}; "
            f"whole-fit CPU ratio {spread(result['fit_ratios'])}",
        ]
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--every", type=int, default=100, help="The probe's every_n_steps.")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, help="Steps per fit (default: 3 periods, at least 300).")
    parser.add_argument("--jit-compile", action="store_true")
    parser.add_argument("--instruments", default="", help="GradientProbe(instruments=...), comma-separated.")
    parser.add_argument("--no-histograms", action="store_true", help="GradientProbe(histograms=False).")
    parser.add_argument("--capture", help="GradientProbe(capture=...), comma-separated (default: all).")
    parser.add_argument("--guard", action="store_true", help="Also a NonFiniteGuard() on the probed fit.")
    args = parser.parse_args(argv)
    if args.every < 1 or args.rounds < 1:
        parser.error(
            f"--every and --rounds must be >= 1. Received: --every={args.every}, "
            f"--rounds={args.rounds}."
        )
    steps = args.steps or args.every * max(3, -(-300 // args.every))
    try:
        options = {
            "instruments": [name for name in args.instruments.split(",") if name],
            "histograms": not args.no_histograms,
        }
        if args.capture is not None:
            options["capture"] = [kind for kind in args.capture.split(",") if kind]
        result = measure(args.model, args.every, args.rounds, steps, args.jit_compile, options, args.guard)
    except ValueError as error:
        parser.error(str(error))
    print(describe(args.model, args.every, result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
