"""One probed ``model.fit`` run, single-device or under a tf.distribute strategy.

Imported by the tests for the single-device reference, and run as a script
(``python distributed_fit.py MODE OUT_DIR LOG_DIR``) for the distributed runs, which
need a process of their own: logical devices must be configured before
TensorFlow initialises any device, and each multi-worker worker is a process.

Modes:
    ``mirrored``: MirroredStrategy over 2 logical CPU devices of this process.
    ``worker``: MultiWorkerMirroredStrategy; ``TF_CONFIG`` names the cluster. Besides the
    probed run, a guard's trip (`guard_nan`) and an own step's skip
    (`distributed_own_step.own_spike`), whose logs only the chief writes.

The run writes ``OUT_DIR/result.npz`` (every probed record and the final
weights) and TensorBoard events under ``LOG_DIR``.
"""

import contextlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

FEATURES = 5
CLASSES = 3
SAMPLES = 48
GLOBAL_BATCH = 8
EPOCHS = 2
EVERY_N_STEPS = 2


def data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=(SAMPLES,)).astype("int32")
    return x, y


def build_model(optimizer=None):
    """A small functional classifier with fixed, seed-independent weights."""
    import keras

    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(6, activation="relu", name="hidden")(inputs)
    hidden = keras.layers.Dense(4, activation="tanh", name="middle")(hidden)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="out")(hidden)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(scale=0.5, size=w.shape).astype("float32") for w in model.weights])
    model.compile(
        optimizer=optimizer or keras.optimizers.Adam(0.01),
        loss="sparse_categorical_crossentropy",
        jit_compile=False,
    )
    return model


def work_around_keras_multi_worker_bugs(model):
    """Lets ``model.fit`` run under MultiWorkerMirroredStrategy (Keras <= 3.15).

    Keras 3 on TensorFlow fails twice under a multi-worker strategy, with or
    without kgrad (keras-team/keras#20585, tensorflow/tensorflow#72388):

    - building the model from the first batch calls
      ``strategy.reduce("MEAN", (x, y), axis=None)``, which a multi-worker
      strategy rejects for a tuple ("Attempt to convert a value
      (PerReplica...) to a Tensor"). The build only needs shapes: each
      worker's local part is used instead;
    - the logs of each step (scalars) are reduced with
      ``strategy.reduce("MEAN", value, axis=0)``: "Invalid reduction dimension
      0 for input with 0 dimensions". Scalars are averaged over replicas
      instead, as Keras does under MirroredStrategy.
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer

    strategy = model.distribute_strategy

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(
                    lambda value: strategy.experimental_local_results(value)[0], next(batches)
                )
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = maybe_symbolic_build
    reduce_per_replica = keras_tf_trainer.reduce_per_replica

    def reduce_scalars_per_replica(values, strategy, reduction="auto"):
        if reduction in ("auto", "mean"):
            return tf.nest.map_structure(
                lambda value: strategy.reduce("MEAN", value, axis=None)
                if isinstance(value, tf.distribute.DistributedValues)
                else value,
                values,
            )
        return reduce_per_replica(values, strategy, reduction)

    keras_tf_trainer.reduce_per_replica = reduce_scalars_per_replica


def _work_around_if_multi_worker(model):
    import tensorflow as tf

    if isinstance(model.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
        work_around_keras_multi_worker_bugs(model)


def train(strategy, log_dir):
    """Trains with a GradientProbe logging to ``log_dir``; returns ``(records, weights)``."""
    import tensorflow as tf

    import kgrad

    with strategy.scope():
        model = build_model()
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        work_around_keras_multi_worker_bugs(model)
    records = []
    probe = kgrad.GradientProbe(
        log_dir,
        layers="all",
        every_n_steps=EVERY_N_STEPS,
        bucket_count=10,
        on_probe=records.append,
        statistics="all",  # every tag of each kind is compared
    )
    x, y = data()
    model.fit(
        x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[probe]
    )
    return records, model.get_weights()


def train_mixed_precision(strategy):
    """The same run under the ``mixed_float16`` policy, with loss scaling.

    The scale stays low enough for no step to overflow: under MirroredStrategy,
    Keras' LossScaleOptimizer decides whether to skip a step from the first
    replica's gradients only, so an overflow on another replica is applied
    (see the README, "MultiWorkerMirroredStrategy").
    """
    import keras

    import kgrad

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            model = build_model(
                keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01), initial_scale=2.0**8)
            )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    records = []
    probe = kgrad.GradientProbe(
        every_n_steps=EVERY_N_STEPS, bucket_count=10, on_probe=records.append, statistics="all"
    )
    x, y = data()
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[probe])
    return records, model.get_weights()


def own_step_probe_error(strategy):
    """The message of the error GradientProbe raises under this strategy, for a model's own train_step."""
    import keras

    import kgrad

    class OwnStep(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    with strategy.scope():
        plain = build_model()
        model = OwnStep(plain.inputs, plain.outputs)
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", jit_compile=False)
    x, y = data()
    try:
        model.fit(x, y, batch_size=GLOBAL_BATCH, verbose=0, callbacks=[kgrad.GradientProbe()])
    except ValueError as error:
        return str(error)
    return "no error"


#: The example given a NaN: batch 3's seventh, in the second replica's half of it.
NAN_EXAMPLE = 3 * GLOBAL_BATCH + 6
#: The batch whose inputs are scaled x1000 in the spike run.
SPIKE_BATCH = 40


def _states(model, states, variables=None):
    """A callback appending, at each batch end, every replica's copy of ``variables``.

    ``variables``: the model's weights and its optimizer's variables, unless given.
    """
    import keras

    def snapshot(batch, logs):
        states.append([
            [np.array(copy) for copy in model.distribute_strategy.experimental_local_results(v.value)]
            for v in (variables or model.weights + model.optimizer.variables)
        ])

    return keras.callbacks.LambdaCallback(on_train_batch_end=snapshot)


def guard_nan(strategy):
    """A run whose batch 3 holds a NaN: ``(report fields, per-batch states of every replica)``.

    A `kgrad.GradientProbe` beside the guard: its records before the trip are in the fields.
    """
    import kgrad

    with strategy.scope():
        model = build_model()
    _work_around_if_multi_worker(model)
    x, y = data()
    x[NAN_EXAMPLE, 2] = np.nan
    guard, states, records = kgrad.NonFiniteGuard(), [], []
    probe = kgrad.GradientProbe(every_n_steps=EVERY_N_STEPS, on_probe=records.append)
    model.fit(
        x, y, batch_size=GLOBAL_BATCH, shuffle=False, verbose=0,
        callbacks=[probe, guard, _states(model, states)],
    )
    report = guard.report
    fields = {
        "step": report.step, "tensor": report.tensor, "last_finite_step": report.last_finite_step,
        "last_finite_norm": report.last_finite_norm, "replay_note": report.replay_note,
        "non_finite": {name: [float(c) for c in counts] for name, counts in report.non_finite.items()},
        "iterations": int(model.optimizer.iterations.numpy()),
        "records": [[r.step, {tag: float(v) for tag, v in r.scalars.items()}] for r in records],
    }
    return fields, states


#: The spike rule's per-step tags compared with one device's.
SPIKE_TAGS = (
    "global/step_skipped", "global/spike_score", "spike_window_mean/log_loss", "spike_window_std/log_loss",
    "spike_window_mean/log_grad_norm", "spike_window_std/log_grad_norm",
)


def guard_spike(strategy, log_dir):
    """A regression run whose batch 40's inputs are x1000, skipping spikes: ``(skip fields, states)``."""
    import keras

    import kgrad

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (50 * GLOBAL_BATCH, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    x[SPIKE_BATCH * GLOBAL_BATCH : (SPIKE_BATCH + 1) * GLOBAL_BATCH] *= 1000.0
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="out")])
        model.set_weights([np.full((4, 1), 0.3, "float32"), np.zeros(1, "float32")])
        model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=False)
    _work_around_if_multi_worker(model)
    guard, states = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16, spike_sample_every=1, log_dir=log_dir), []
    with _kgrad_reads() as (reads, phase):
        model.fit(x, y, batch_size=GLOBAL_BATCH, shuffle=False, verbose=0,
                  callbacks=[phase, guard, _states(model, states)])
    scalars = kgrad.read_logs(log_dir)["kgrad"]["scalars"]
    fields = {
        "steps": [s.step for s in guard.skipped_steps], "iterations": int(model.optimizer.iterations.numpy()),
        "values": guard.skipped_steps[0].values, "z_scores": guard.skipped_steps[0].z_scores,
        "series": {tag: [scalars[tag].steps.tolist(), scalars[tag].values.tolist()] for tag in SPIKE_TAGS},
        "stopped": guard.spike_report is not None or guard.report is not None,
        "reads": sorted(reads),
    }
    return fields, states


def _initializes_a_mirror():
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "initial_value_fn" and "mirrored_strategy" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def _kgrad_reads():
    """``(reads, callback)``: the phases of fit (a batch from its begin, or "end") with host reads.

    As tests/test_no_host_sync.py: an eager read of a variable named ``kgrad...`` is a host
    read, except where MirroredStrategy creates a variable (once): it initialises each replica's
    copy from the first's, a read on the devices.
    """
    import keras
    from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

    import tensorflow as tf

    reads, phase = set(), ["begin"]
    original = BaseResourceVariable._read_variable_op

    def read(variable, *args, **kwargs):
        if tf.executing_eagerly() and "kgrad" in variable.name and not _initializes_a_mirror():
            reads.add(str(phase[0]))
        return original(variable, *args, **kwargs)

    callback = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: phase.__setitem__(0, batch),
        on_epoch_end=lambda epoch, logs: phase.__setitem__(0, "end"),
    )
    BaseResourceVariable._read_variable_op = read
    try:
        yield reads, callback
    finally:
        BaseResourceVariable._read_variable_op = original


def save_guard_runs(out_dir, strategy, names=("guard_nan", "guard_spike")):
    """Writes the results of the runs ``names`` under ``out_dir`` (JSON, and the states as .npz)."""
    import json

    spike_logs = os.path.join(out_dir, "spike_logs")
    runs = {"guard_nan": guard_nan, "guard_spike": lambda s: guard_spike(s, spike_logs)}
    for name in names:
        fields, states = runs[name](strategy)
        with open(os.path.join(out_dir, f"{name}.json"), "w") as file:
            json.dump(fields, file)
        save_states(os.path.join(out_dir, f"{name}.npz"), states)


def save_states(path, states):
    """Writes `_states`' snapshots: ``batch/variable/replica`` -> that replica's copy."""
    np.savez(path, **{
        f"{batch}/{variable}/{replica}": copy
        for batch, variables in enumerate(states)
        for variable, copies in enumerate(variables)
        for replica, copy in enumerate(copies)
    })


def save(path, records, weights):
    arrays = {f"weight/{i}": w for i, w in enumerate(weights)}
    arrays["steps"] = np.array([record.step for record in records])
    for index, record in enumerate(records):
        for tag, value in record.scalars.items():
            arrays[f"scalar/{index}/{tag}"] = np.float64(value)
        for tag, buckets in record.histograms.items():
            arrays[f"histogram/{index}/{tag}"] = buckets
    np.savez(path, **arrays)


def split_cpu(count):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count
    )


def main(mode, out_dir, log_dir):
    import tensorflow as tf

    if mode == "mirrored":
        split_cpu(2)  # before any other TensorFlow use
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    elif mode == "worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        raise SystemExit(f"unknown mode {mode!r}; expected 'mirrored' or 'worker'")
    records, weights = train(strategy, log_dir)
    save(os.path.join(out_dir, "result.npz"), records, weights)
    if mode == "mirrored":
        save(os.path.join(out_dir, "mixed.npz"), *train_mixed_precision(strategy))
        with open(os.path.join(out_dir, "own_step_probe_error.txt"), "w") as file:
            file.write(own_step_probe_error(strategy))
    import distributed_own_step  # this script's folder is on the path

    if mode == "mirrored":
        save_guard_runs(out_dir, strategy)
        distributed_own_step.save_runs(out_dir, strategy, os.path.join(out_dir, "own_spike_logs"))
    else:  # a trip and a skip; the spike's logs shared by the workers, as the probe's
        save_guard_runs(out_dir, strategy, names=["guard_nan"])
        shared_logs = os.path.join(os.path.dirname(log_dir), "own_spike_logs")
        distributed_own_step.save_runs(out_dir, strategy, shared_logs, names=["own_spike"])
    print(f"done: {strategy.num_replicas_in_sync} replicas, {len(records)} records", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
