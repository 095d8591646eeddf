"""Probes one model on one device and under `keras.distribution.DataParallel` over 2 CPU devices.

Run by tests/jax/test_data_parallel_jax.py in its own process: the number of
host devices is fixed when JAX starts (``XLA_FLAGS``). Prints one JSON object:
the records of each run, and the largest weight difference between the
probed and the plain DataParallel fit.
"""

import json
import os
import sys

if __name__ == "__main__":  # (pytest imports this file for its doctests: leave its environment alone)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(32, 6)).astype("float32")
y = rng.normal(size=(32, 1)).astype("float32")


def build(distribution):
    keras.backend.clear_session()  # the same layer and op names in each run ("sin", not "sin_1")
    keras.distribution.set_distribution(distribution)  # (clear_session unsets it)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    waves = keras.ops.sin(hidden)  # an op node
    outputs = keras.layers.Dense(1, name="out")(waves)
    model = keras.Model(inputs, outputs, name="m")
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def fit(probed, distribution=None):
    model = build(distribution)
    records = []
    callbacks = [kgrad.GradientProbe(every_n_steps=2, on_probe=records.append, statistics="all",
                                     layers="all")] if probed else []
    # 8 examples a step: the global batch, split over the devices under DataParallel.
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    return model, records


def as_json(records):
    return [
        {"step": r.step, "scalars": r.scalars,
         "histograms": {tag: np.asarray(h).tolist() for tag, h in r.histograms.items()}}
        for r in records
    ]


def main():
    one_device, one_device_records = fit(probed=True)
    data_parallel = keras.distribution.DataParallel(devices=jax.devices())
    parallel, parallel_records = fit(probed=True, distribution=data_parallel)
    plain_parallel, _ = fit(probed=False, distribution=data_parallel)
    json.dump({
        "devices": len(jax.devices()),
        "sharding": str(parallel.trainable_variables[0].value.sharding),
        "one_device": as_json(one_device_records),
        "data_parallel": as_json(parallel_records),
        "weight_difference": max(float(np.abs(a - b).max())
                                 for a, b in zip(parallel.get_weights(), plain_parallel.get_weights())),
    }, sys.stdout)


if __name__ == "__main__":
    main()
