"""Where a configuration's added CPU time goes, op by op (TensorFlow profiler).

The timed benchmark (`benchmarks.run`) says how much a configuration costs;
this says where. For each configuration it trains the model as the benchmark
does (same model, seed, data and callbacks), warms it up, then profiles one
``fit`` with ``tf.profiler`` and sums the time of every TensorFlow op that ran
during it, by op type, per step. The baseline is profiled
the same way, so the table shows what each op type adds. Process CPU time per
step is measured beside it in an unprofiled ``fit`` (the profiler slows the
host): what is not op time there is Python and TensorFlow's executor, kgrad's
host side included.

Op time is summed over the executor's threads: with two cores busy it is
close to CPU time, but an op waiting on a lock or on oneDNN's threads counts
as time. Use it for shares, the timed benchmark for ratios.

Example (from the repository root; about 25 s for the MLP, 75 s for the MobileNet)::

    python -m benchmarks.profile_ops --model mlp --configs probe_n1,guard
"""

import argparse
import collections
import dataclasses
import glob
import os
import re
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from benchmarks import configs as configs_module  # noqa: E402
from benchmarks import models  # noqa: E402

#: An op's trace event is named ``node/name:OpType`` (a graph node name has
#: no colon or space); the host plane's other events (the executor's
#: ``ExecutorState::Process``, tf.data's ``Iterator::...``, eager dispatch's
#: ``EagerLocalExecute: ...``) are not ops. Ops inside functions that the
#: train function calls without inlining them (kgrad's shared summary
#: functions) are named from their own graphs, so every op counts.
_OP_EVENT = re.compile(r"^(?P<node>[A-Za-z0-9.][A-Za-z0-9_./>-]*):(?P<type>[A-Za-z_][A-Za-z0-9_]*)$")


@dataclasses.dataclass
class OpProfile:
    """One configuration's profile: microseconds per step by op type."""

    name: str
    cpu_ms_per_step: float
    op_us_per_step: dict
    op_count_per_step: dict

    @property
    def op_ms_per_step(self):
        return sum(self.op_us_per_step.values()) / 1000


def _xspace_class():
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError as error:  # the module is TensorFlow's, not public API
        raise SystemExit(
            "benchmarks.profile_ops reads the profiler's XSpace protobuf from "
            "tensorflow.tsl.profiler.protobuf.xplane_pb2, which this TensorFlow "
            f"({tf.__version__}) does not have ({error}). Open the trace in "
            "TensorBoard's profile plugin instead."
        ) from error
    return xplane_pb2.XSpace


def op_times(xspace_path):
    """``(total, count)`` Counters of op time (µs) and runs by op type in one trace file."""
    space = _xspace_class()()
    with open(xspace_path, "rb") as file:
        space.ParseFromString(file.read())
    total, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            for event in line.events:
                match = _OP_EVENT.match(plane.event_metadata[event.metadata_id].name)
                if match:
                    total[match["type"]] += event.duration_ps / 1e6
                    count[match["type"]] += 1
    return total, count


def profile_config(spec, config, steps, log_dir):
    """`OpProfile` of one configuration: warm-up, a timed fit, a profiled fit."""
    x, y = models.make_data(spec, 20, 0)
    model = models.build_model(spec, 0, config.jit_compile)
    dataset = models.make_dataset(spec, x, y)
    callbacks = config.make_callbacks(
        os.path.join(log_dir, config.name), x[: spec.batch_size], y[: spec.batch_size]
    )

    def fit():
        model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)

    fit()  # traces the step
    fit()  # the first call after tracing costs more
    started = time.process_time()
    fit()
    cpu_ms = (time.process_time() - started) / steps * 1000
    trace_dir = tempfile.mkdtemp(dir=log_dir)
    tf.profiler.experimental.start(trace_dir)
    try:
        fit()
    finally:
        tf.profiler.experimental.stop()
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if len(paths) != 1:
        raise RuntimeError(f"Expected one *.xplane.pb under {trace_dir}, found {paths}.")
    total, count = op_times(paths[0])
    return OpProfile(
        config.name, cpu_ms,
        {op: us / steps for op, us in total.items()},
        {op: n / steps for op, n in count.items()},
    )


def added_ops_table(baseline, profile, top):
    """Markdown rows: the op types that add the most time to ``baseline``'s step."""
    added = {
        op: profile.op_us_per_step.get(op, 0.0) - baseline.op_us_per_step.get(op, 0.0)
        for op in set(profile.op_us_per_step) | set(baseline.op_us_per_step)
    }
    total_added = sum(added.values())
    lines = [
        f"**`{profile.name}`**: {profile.cpu_ms_per_step:.2f} CPU-ms per step in one unpaired fit "
        f"(baseline {baseline.cpu_ms_per_step:.2f}, ratio "
        f"{profile.cpu_ms_per_step / baseline.cpu_ms_per_step:.2f}); op time "
        f"{profile.op_ms_per_step:.2f} ms per step (baseline {baseline.op_ms_per_step:.2f}), "
        f"{total_added / 1000:+.2f} ms of which are below; "
        f"{sum(profile.op_count_per_step.values()):.0f} ops run per step "
        f"(baseline {sum(baseline.op_count_per_step.values()):.0f}):",
        "",
        "| op type | baseline, µs/step | this, µs/step | added, µs/step "
        "| share of added op time | runs/step |",
        "|---|---|---|---|---|---|",
    ]
    ranked = sorted(added.items(), key=lambda item: -abs(item[1]))
    shown = ranked[:top]
    for op, delta in shown:
        lines.append(
            f"| `{op}` | {baseline.op_us_per_step.get(op, 0.0):.0f} | "
            f"{profile.op_us_per_step.get(op, 0.0):.0f} | {delta:+.0f} | "
            f"{delta / total_added:.0%} | {profile.op_count_per_step.get(op, 0.0):.1f} |"
        )
    rest = sum(delta for _, delta in ranked[top:])
    if len(ranked) > top:
        lines.append(f"| {len(ranked) - top} other op types | | | {rest:+.0f} | {rest / total_added:.0%} | |")
    return "\n".join(lines)


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_ops", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default="mlp", choices=sorted(models.MODELS))
    parser.add_argument(
        "--configs", default="probe_n1,probe_norms_n1,guard",
        help="comma-separated benchmark configurations (see benchmarks/README.md); "
        "each is compared with its baseline",
    )
    parser.add_argument("--steps", type=int, default=50, help="steps per profiled fit")
    parser.add_argument("--top", type=int, default=12, help="op types shown per configuration")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.top < 1:
        parser.error(f"--steps and --top must be positive. Received: --steps={args.steps} --top={args.top}.")
    return args


def main(argv=None):
    args = _parse_args(argv)
    spec = models.MODELS[args.model]
    try:
        chosen = configs_module.select_configs(args.configs.split(","))
    except ValueError as error:
        raise SystemExit(str(error)) from error
    log_dir = tempfile.mkdtemp(prefix="kgrad_profile_")
    try:
        profiles = {config.name: profile_config(spec, config, args.steps, log_dir) for config in chosen}
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    print(f"## {spec.description}: op time per step, {args.steps} steps profiled\n")
    for config in chosen:
        if config.family == "baseline":
            continue
        print(added_ops_table(profiles[config.baseline], profiles[config.name], args.top))
        print()


if __name__ == "__main__":
    sys.exit(main())
