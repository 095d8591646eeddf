"""One probed ``model.fit`` run, single-device or under a tf.distribute strategy.

Imported by the tests for the single-device reference, and run as a script
(``python distributed_fit.py MODE OUT_DIR LOG_DIR``) for the distributed runs, which
need a process of their own: logical devices must be configured before
TensorFlow initialises any device, and each multi-worker worker is a process.

Modes:
    ``mirrored``: MirroredStrategy over 2 logical CPU devices of this process.
    ``worker``: MultiWorkerMirroredStrategy; ``TF_CONFIG`` names the cluster.

The run writes ``OUT_DIR/result.npz`` (every probed record and the final
weights) and TensorBoard events under ``LOG_DIR``.
"""

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


def guard_error(strategy):
    """The message of the error NonFiniteGuard raises under this strategy."""
    import kgrad

    with strategy.scope():
        model = build_model()
    x, y = data()
    try:
        model.fit(x, y, batch_size=GLOBAL_BATCH, verbose=0, callbacks=[kgrad.NonFiniteGuard()])
    except ValueError as error:
        return str(error)
    return "no error"


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
        with open(os.path.join(out_dir, "guard_error.txt"), "w") as file:
            file.write(guard_error(strategy))
    print(f"done: {strategy.num_replicas_in_sync} replicas, {len(records)} records", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
