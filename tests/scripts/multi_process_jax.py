"""One of two JAX processes (4 CPU devices each) that train one model split over all 8 (issue 52).

Run by tests/jax/test_multi_process_jax.py as two processes:
``python multi_process_jax.py PROCESS_ID PORT OUT_DIR``; the coordinator (process
0's) listens on 127.0.0.1:PORT. A ``(2, 4)`` mesh ``["batch", "model"]`` over the 8
devices of both processes (process 0's four hold row 0 of ``batch``); the model's
kernels are split on both axes. Each process feeds its half of each global batch
(``auto_shard_dataset = False``). Three fits, in order, each saying on stdout what
it did:

1. ``probe``: a `kgrad.GradientProbe` (``statistics="all"``, histograms, the
   optimizer instrument) writing to ``OUT_DIR/probe_<id>``, every step, each
   histogram counted on the shards (`kgrad.backends.jax.summarize.sharded_counts`);
   its records go to ``OUT_DIR/records_<id>.json``.
2. ``guard``: a `kgrad.NonFiniteGuard` logging to ``OUT_DIR/guard_<id>``; a NaN in
   an example of step 1 that only process 1 holds. The report and the steps each
   process ran go to ``OUT_DIR/guard_<id>.json``, with `kgrad.replay_step` of the
   guard's model (the state of before the trip) on `OVERFLOW`, each process its half:
   its NaN/Inf is born inside a layer, not in the data; and what a guard with a
   ``dump_dir`` says (it refuses to gather the model and the batch). Then the same for the
   model with its own ``train_step`` (`GuideModel`, `kgrad.value_and_grad`), under ``own_step``:
   its replay runs the step eagerly, part by part, on both processes together.
3. ``long``: a probed fit that runs until the test kills a process, writing to
   ``OUT_DIR/long_<id>``; it prints ``step N`` after each step.
"""

import json
import os
import sys

if __name__ == "__main__":  # (pytest imports this file for its doctests: leave its environment alone)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402
from kgrad.backends.jax.summarize import log_histograms  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_parallel_hlo_jax as hlo_script  # noqa: E402  (the layout: kernels split on both axes)
# The model (two Dense layers) and its data (2 global batches of 8).
from model_parallel_values_jax import features, float_model as build, labels  # noqa: E402

GLOBAL_BATCH = 8
#: The guard's NaN: step 1, example 6 of its global batch (in process 1's half).
NAN_AT = (1 * GLOBAL_BATCH + 6, 3)
#: A global batch whose example 6 (process 1's half) overflows the first layer: an Inf born in `up`.
OVERFLOW = features[:GLOBAL_BATCH].copy()
OVERFLOW[6] = 3e38
#: The fields of a replay's report that the test compares with one process's.
BORN = ("born_in", "born_at", "born_type", "born_path", "born_inside", "born_nan_count", "born_inf_count",
        "born_input_range", "replayed", "replay_note")


def probe(log_dir=None, on_probe=None):
    return kgrad.GradientProbe(log_dir, every_n_steps=1, on_probe=on_probe, statistics="all", histograms=True,
                               instruments=["optimizer"])


def model_parallel():
    """The layout of tests/scripts/model_parallel_hlo_jax.py over the devices of both processes."""
    distribution = hlo_script.model_parallel()
    distribution.auto_shard_dataset = False  # each process feeds its own half of each global batch
    return distribution


def half(array, process):
    """The examples of ``array`` that ``process`` feeds: its half of each global batch."""
    per_batch = array.reshape(-1, 2, GLOBAL_BATCH // 2, *array.shape[1:])
    return per_batch[:, process].reshape(-1, *array.shape[1:])


class Progress(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(f"step {batch}", flush=True)


def main(process, port, out):
    import jax

    # When the other process dies, this one's collective fails at once, and its exit waits for the
    # distributed service to miss the dead one's heartbeats: 20 s, not the default 100.
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process,
                               heartbeat_timeout_seconds=20)
    assert jax.process_count() == 2 and len(jax.devices()) == 8 and len(jax.local_devices()) == 4

    records = []
    model = build(model_parallel())
    # Every histogram counted on each shard and summed across both processes' devices (from 2**17
    # elements otherwise: these tensors are small); the long fit below scatters them.
    log_histograms.COUNTED_IN_ONE_REDUCTION_FROM = 1
    model.fit(half(features, process), half(labels, process), batch_size=GLOBAL_BATCH // 2, shuffle=False,
              verbose=0, callbacks=[probe(os.path.join(out, f"probe_{process}"), records.append)])
    log_histograms.COUNTED_IN_ONE_REDUCTION_FROM = 2**17
    with open(os.path.join(out, f"records_{process}.json"), "w") as file:
        json.dump([{"step": r.step, "scalars": r.scalars,
                    "histograms": {tag: np.asarray(h).tolist() for tag, h in r.histograms.items()}}
                   for r in records], file)
    print("probe done", flush=True)

    bad = features.copy()
    bad[NAN_AT] = np.nan
    guard = kgrad.NonFiniteGuard(log_dir=os.path.join(out, f"guard_{process}"))
    model = build(model_parallel())
    model.fit(half(bad, process), half(labels, process), batch_size=GLOBAL_BATCH // 2, shuffle=False,
              verbose=0, callbacks=[guard])
    report = guard.report
    replayed = kgrad.replay_step(model, (half(OVERFLOW, process), half(labels[:GLOBAL_BATCH], process)))
    try:  # a dump would gather the model and the batch on one host: refused before the first step
        model.fit(half(bad, process), half(labels, process), batch_size=GLOBAL_BATCH // 2, verbose=0,
                  callbacks=[kgrad.NonFiniteGuard(dump_dir=os.path.join(out, "dump"))])
        refusal = None
    except ValueError as error:
        refusal = str(error)
    own_guard = kgrad.NonFiniteGuard()
    own = build(model_parallel(), own_step=True)
    own.fit(half(bad, process), half(labels, process), batch_size=GLOBAL_BATCH // 2, shuffle=False,
            verbose=0, callbacks=[own_guard])
    own_replayed = kgrad.replay_step(own, (half(OVERFLOW, process), half(labels[:GLOBAL_BATCH], process)))
    with open(os.path.join(out, f"guard_{process}.json"), "w") as file:
        json.dump({
            "iterations": int(model.optimizer.iterations), "step": report.step, "tensor": report.tensor,
            **{field: getattr(report, field) for field in BORN},
            "replay_step": {field: getattr(replayed, field) for field in BORN}, "dump_refusal": refusal,
            "own_step": {
                "iterations": int(own.optimizer.iterations), "step": own_guard.report.step,
                **{field: getattr(own_guard.report, field) for field in BORN},
                "replay_step": {field: getattr(own_replayed, field) for field in BORN},
            },
        }, file)
    print("guard done", flush=True)

    model = build(model_parallel())
    many, their_labels = np.concatenate([features] * 1000), np.concatenate([labels] * 1000)
    model.fit(half(many, process), half(their_labels, process), batch_size=GLOBAL_BATCH // 2, shuffle=False,
              verbose=0, callbacks=[probe(os.path.join(out, f"long_{process}")), Progress()])


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
