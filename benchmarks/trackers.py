"""What a `kgrad.WandbSink` (W&B offline) adds to a probe writing TensorBoard (issue 56).

Three identical models train in one process, each in ONE long ``fit`` in its
own thread, taking turns of ``--sample-steps`` steps (`benchmarks.interleave`):

- ``tensorboard``: ``GradientProbe(log_dir, layers="all", every_n_steps=N)``, the reference;
- ``tensorboard_aa``: the same again, the A/A control;
- ``wandb``: the same probe with ``sinks=[kgrad.WandbSink(report=False)]`` on an offline run.

Each round runs the reference between the other two (alternating which goes
first), and each ratio is a turn's process CPU time over the reference turn
beside it; the headline is the median over the pairs, with its bootstrap 95%
interval, next to the A/A's. The sink's worker thread is in the process CPU
time; so that what it does for a turn is counted in that turn (and not in the
next configuration's), the ``wandb`` fit waits after each step until its
sink's queue is empty (an idle wait: no CPU). W&B's own service process
(``wandb-core``), which writes the run file, is outside that figure: its CPU
time over the timed turns is given beside it, as a share of the ``wandb``
turns' CPU. The HTML report is not attached (``report=False``): it is a
one-off at the end of ``fit``, timed once at the end.

Run (about 2 minutes on 2 cores for the MLP with the defaults)::

    python -m benchmarks.trackers --model mlp --every 10 --pairs 15
"""

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402
from benchmarks import configs, machine  # noqa: E402
from benchmarks.interleave import ConfigRunner  # noqa: E402
from benchmarks.models import MODELS, build_model, make_data, make_dataset  # noqa: E402
from benchmarks.timing import ratio_summary, round_triplets  # noqa: E402

REFERENCE = "tensorboard"


class _TimedWandbSink(kgrad.WandbSink):
    """`kgrad.WandbSink` that adds up the CPU time of its worker thread's calls (``time.thread_time``)."""

    def __init__(self):
        super().__init__(report=False)
        self.calls, self.thread_cpu = 0, 0.0

    def write_record(self, record):
        start = time.thread_time()
        super().write_record(record)
        self.thread_cpu += time.thread_time() - start
        self.calls += 1


class _Drain(keras.callbacks.Callback):
    """After each step, waits (idle) until the sink's worker has made every queued call."""

    def __init__(self, sink):
        super().__init__()
        self.sink = sink

    def on_train_batch_end(self, batch, logs=None):
        worker = getattr(self.sink, "_kgrad_worker", None)
        while worker is not None and (worker._jobs or worker._in_flight):
            time.sleep(0.001)


def _descendants_cpu():
    """CPU seconds (user + system) of this process's descendant processes, from /proc (Linux)."""
    children, total = {}, 0.0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append((int(pid), fields))
    ticks = os.sysconf("SC_CLK_TCK")
    pending = [os.getpid()]
    while pending:
        for pid, fields in children.get(pending.pop(), []):
            total += (int(fields[11]) + int(fields[12])) / ticks
            pending.append(pid)
    return total


def _runners(spec, every, log_dir):
    x, y = make_data(spec, distinct_batches=20, seed=0)
    steps_per_epoch = every * 10
    runners, timed_sink = {}, None
    for name in (REFERENCE, "tensorboard_aa", "wandb"):
        sink = _TimedWandbSink() if name == "wandb" else None
        timed_sink = sink or timed_sink
        probe = kgrad.GradientProbe(os.path.join(log_dir, name), layers=configs.PROBE_LAYERS,
                                    every_n_steps=every, sinks=[sink] if sink else None)
        callbacks = [probe, _Drain(sink)] if sink else [probe]
        model = build_model(spec, seed=0, jit_compile=False)
        runners[name] = ConfigRunner(name, model, make_dataset(spec, x, y), steps_per_epoch, callbacks)
    return runners, timed_sink


def measure(spec, every, pairs, sample_steps):
    """Interleaved turns; returns the per-pair CPU and wall ratios to the reference and wandb-core's share."""
    import wandb

    log_dir = tempfile.mkdtemp(prefix="kgrad-trackers-")
    run = wandb.init(mode="offline", dir=log_dir, project="kgrad-benchmark")
    runners, sink = _runners(spec, every, log_dir)
    for runner in runners.values():
        runner.start(epochs=1)
    ratios = {name: {"cpu": [], "wall": []} for name in runners if name != REFERENCE}
    core_cpu, wandb_cpu, reference_cpu = 0.0, 0.0, []
    for round_index in range(pairs):
        for before, after in round_triplets(["wandb", "tensorboard_aa"], round_index):
            samples = {}
            for name in (before, REFERENCE, after):
                if name is None:
                    continue
                core_before = _descendants_cpu()
                samples[name] = runners[name].run_steps(sample_steps)
                if name == REFERENCE:
                    reference_cpu.append(samples[name].cpu / sample_steps)
                if name == "wandb":
                    core_cpu += _descendants_cpu() - core_before
                    wandb_cpu += samples[name].cpu
            for name in (before, after):
                if name is not None:
                    ratios[name]["cpu"].append(samples[name].cpu / samples[REFERENCE].cpu)
                    ratios[name]["wall"].append(samples[name].wall / samples[REFERENCE].wall)
    report_cpu = time.process_time()
    for runner in runners.values():
        runner.finish()
    html_cpu = _html_report_cpu(os.path.join(log_dir, "wandb"), run)
    run.finish()
    summaries = {name: {kind: ratio_summary(values) for kind, values in kinds.items()}
                 for name, kinds in ratios.items()}
    return summaries | {
        "wandb_core_cpu_share": core_cpu / wandb_cpu,
        "finish_cpu_s": time.process_time() - report_cpu,
        "html_report_cpu_s": html_cpu,
        "reference_step_cpu_ms": 1000 * float(np.median(reference_cpu)),
        "sink_call_cpu_ms": 1000 * sink.thread_cpu / max(sink.calls, 1),
        "sink_calls": sink.calls,
        "every": every,
    }


def _html_report_cpu(log_dir, run):
    """CPU seconds of rendering and attaching the end-of-fit report once (W&B copies the page)."""
    import wandb

    from kgrad.dashboard import html_report as html

    start = time.process_time()
    page = html.render_html(html.report_data(log_dir))
    run.log({"kgrad/report": wandb.Html(page, inject=False, data_is_not_path=True)})
    return time.process_time() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--sample-steps", type=int, default=100, help="a multiple of --every")
    args = parser.parse_args(argv)
    if args.sample_steps % args.every:
        parser.error("--sample-steps must be a multiple of --every. Received: "
                     f"--sample-steps={args.sample_steps} --every={args.every}.")
    started = machine.describe()
    results = measure(MODELS[args.model], args.every, args.pairs, args.sample_steps)
    results["machine"] = started | {"load_average_end": machine.load_average()}
    print(json.dumps(results, indent=1))
    for name in ("wandb", "tensorboard_aa"):
        cpu, wall = results[name]["cpu"], results[name]["wall"]
        interval = f"{cpu['median_low']:.3f}-{cpu['median_high']:.3f}"
        print(f"{name} / {REFERENCE}: CPU {cpu['median']:.3f} ({interval}), wall {wall['median']:.3f}, "
              f"n={cpu['n']}")
    per_step = results["sink_call_cpu_ms"] / (args.every * results["reference_step_cpu_ms"])
    print(f"reference step: {results['reference_step_cpu_ms']:.2f} CPU-ms; a WandbSink.write_record: "
          f"{results['sink_call_cpu_ms']:.3f} CPU-ms in its thread ({results['sink_calls']} calls): "
          f"+{per_step:.4f} of the reference at every_n_steps={args.every}")
    print(f"wandb-core CPU: {results['wandb_core_cpu_share']:.3f} of the wandb turns' CPU; "
          f"end-of-fit HTML report: {results['html_report_cpu_s']:.2f} CPU-s")


if __name__ == "__main__":
    main()
