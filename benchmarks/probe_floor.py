"""The least a probe at ``every_n_steps=1`` can cost, whoever writes its statistics.

`benchmarks.profile_ops` shows that the statistics kernels are most of what a
probed step adds. A faster kernel (a fused one, written in C++) would still
have to read every captured element at least once, and the step would still
have to capture the tensors and send a record to the host. This script
measures that floor, in the same process as plain ``fit`` and with the same
interleaved pairs as `benchmarks.run`, by training with `kgrad.GradientProbe`
whose statistics are replaced (while its step is traced) by less than they
must compute:

- ``floor_capture`` / ``floor_capture_norms``: the statistics read one
  element of each tensor. What is left is the capture itself: the backward
  pass over the activations and the inputs (dJ/dx), the update ratios, the
  record written to device buffers, read back and written to the event file
  every step (histograms of zeros included, or not).
- ``floor_one_pass`` / ``floor_one_pass_norms``: one reduction (the max) over
  every captured element, the cheapest kernel that reads them all: no
  implementation of the statistics, fused or not, reads less.
- ``floor_read_once`` / ``floor_read_once_norms``: one sum per captured
  tensor (issue 53's read-once floor; the same read as the max).

The ``*_norms`` variants have ``histograms=False`` (compared with the 1.10
target), the others write histograms (the 1.25 target). ``probe_n1`` and
``probe_norms_n1`` are kgrad as it is. The numbers these floors report are
wrong by design: they are for timing only.

Run (11 minutes for the three models, measured)::

    python -m benchmarks.probe_floor --models mlp,cnn,mobilenet
"""

import argparse
import dataclasses
import os
import tempfile
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from benchmarks import bench, configs, run  # noqa: E402
from benchmarks.models import MODELS  # noqa: E402
from kgrad.backends.tensorflow.summarize import stats  # noqa: E402

_REAL_SUMMARIZE_MANY = stats.summarize_many


def _capture_only(flat):
    # One element of each tensor: the tensor must exist (unread, TensorFlow
    # would prune the backward pass that computes it), nothing more.
    return [tf.reduce_max(values[:1]) for values in flat]


def _one_pass(flat):
    return [tf.reduce_max(values) for values in flat]


def _read_once(flat):
    # The read-once floor of issue 53: one sum per captured tensor.
    return [tf.reduce_sum(values) for values in flat]


#: Floor name -> fn(flat float32 tensors) -> one scalar per tensor.
FLOORS = {"floor_capture": _capture_only, "floor_one_pass": _one_pass, "floor_read_once": _read_once}


def _floor_of_current_thread():
    # `benchmarks.interleave` runs each configuration's fit, where its step
    # is traced, in a thread named after the configuration.
    name = threading.current_thread().name.removeprefix("bench-").removesuffix("_norms")
    return FLOORS.get(name)


def _summarize_many(tensors, bucket_count=None):
    """`summarize.stats.summarize_many`, or a floor's stand-in in a floor's thread."""
    floor = _floor_of_current_thread()
    if floor is None or not tensors:
        return _REAL_SUMMARIZE_MANY(tensors, bucket_count)
    flat = [tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors]
    values = tf.stack(floor(flat))
    # The value in every column but the non-finite count, which stays 0: a
    # count above 0 sends `global/grad_norm` down its slower exact branch.
    finite_columns = tf.constant([name != "nonfinite" for name in stats.MOMENT_NAMES], tf.float32)
    moments = values[:, tf.newaxis] * finite_columns
    histograms = None if bucket_count is None else tf.zeros([len(tensors), bucket_count, 3])
    return moments, histograms


def floor_configs(floors=tuple(FLOORS), others=("probe_linear_n1",)):
    """kgrad's two ``every_n_steps=1`` configurations, their ``floors``, baselines and ``others``."""
    by_name = {config.name: config for config in configs.all_configs()}
    chosen = [by_name[name] for name in (configs.BASELINE, configs.AA_CONTROL, *others)]
    for kgrad_name, suffix in (("probe_n1", ""), ("probe_norms_n1", "_norms")):
        kgrad_config = by_name[kgrad_name]
        chosen.append(kgrad_config)
        for floor in floors:
            chosen.append(
                configs.Config(
                    name=f"{floor}{suffix}",
                    label=f"{kgrad_config.label}, statistics replaced by {floor}",
                    family="floor",
                    jit_compile=False,
                    every_n_steps=1,
                    make_callbacks=kgrad_config.make_callbacks,
                )
            )
    return chosen


#: The floor every configuration is also compared with (issue 53).
READ_ONCE = "floor_read_once"


def table(model_name, results):
    """Markdown rows: configuration, pairs, CPU ratio median [IQR], wall ratio, ratio to the read-once floor.

    The last column divides the configuration's median CPU ratio by the
    read-once floor's (``_norms`` configurations by ``floor_read_once_norms``),
    where the run measured it.
    """
    lines = [
        f"{model_name} (plain step {results[configs.BASELINE]['cpu_ms_per_step']:.2f} CPU-ms)",
        "",
        "| config | pairs | CPU ratio, median [IQR] | wall ratio | CPU ratio / read-once floor |",
        "|---|---|---|---|---|",
    ]
    for name, result in results.items():
        cpu, wall = result.get("cpu_ratio"), result.get("wall_ratio")
        if cpu is None:
            continue
        floor = results.get(READ_ONCE + ("_norms" if "norms" in name else ""), {}).get("cpu_ratio")
        to_floor = f"{cpu['median'] / floor['median']:.3f}" if floor else "–"
        lines.append(
            f"| `{name}` | {cpu['n']} | {cpu['median']:.3f} [{cpu['q1']:.3f}–{cpu['q3']:.3f}] "
            f"| {wall['median']:.3f} | {to_floor} |"
        )
    return "\n".join(lines)


def measure(model_names, settings, floors=tuple(FLOORS), others=("probe_linear_n1",)):
    """``{model: results}`` of `floor_configs`, as `benchmarks.bench.ModelBench` returns them."""
    measured = {}
    stats.summarize_many = _summarize_many
    try:
        with tempfile.TemporaryDirectory(prefix="kgrad-floor-") as log_root:
            for name in model_names:
                measured[name] = bench.ModelBench(
                    MODELS[name], floor_configs(floors, others), settings, log_root
                ).run()
    finally:
        stats.summarize_many = _REAL_SUMMARIZE_MANY
    return measured


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=run._names, default=["mlp"])
    parser.add_argument("--pairs", type=int, default=7, help="Timed pairs per configuration.")
    parser.add_argument(
        "--floors", type=run._names, default=list(FLOORS), help="Floors to measure, comma-separated."
    )
    parser.add_argument(
        "--others", type=run._names, default=["probe_linear_n1"],
        help="Other configurations of benchmarks.configs to measure in the same run (e.g. probe_n10,probe_n100).",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; expected names among {', '.join(MODELS)}.")
    if args.pairs < 1:
        parser.error(f"--pairs must be >= 1. Received: --pairs={args.pairs}.")
    settings = dataclasses.replace(run.PRESETS["full"], pairs=args.pairs, min_pairs=min(5, args.pairs))
    unknown = sorted(set(args.floors) - set(FLOORS))
    if unknown:
        parser.error(f"unknown floor(s) {unknown}; expected names among {', '.join(FLOORS)}.")
    for name, results in measure(args.models, settings, args.floors, args.others).items():
        print(table(name, results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
