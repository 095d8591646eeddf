"""Probes and guards models on one device and under `keras.distribution.DataParallel` over 2 CPU devices.

Run by tests/jax/test_data_parallel_jax.py in its own process: the number of
host devices is fixed when JAX starts (``XLA_FLAGS``). Prints one JSON object:
the records of each run, the largest weight difference between the probed
(or guarded) and the plain DataParallel fit, and the guard's reports of a
NaN born at the same step on one device and under DataParallel; for a model
with Keras' own ``train_step`` and for one with its own (``kgrad.value_and_grad``).
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jax"))
from guide_model import GuideModel  # noqa: E402  (a model with its own train_step)

rng = np.random.default_rng(0)
x = rng.normal(size=(32, 6)).astype("float32")
y = rng.normal(size=(32, 1)).astype("float32")


def build(distribution, own_step=False):
    keras.backend.clear_session()  # the same layer and op names in each run ("sin", not "sin_1")
    keras.distribution.set_distribution(distribution)  # (clear_session unsets it)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    waves = keras.ops.sin(hidden)  # an op node
    outputs = keras.layers.Dense(1, name="out")(waves)
    model = (GuideModel if own_step else keras.Model)(inputs, outputs, name="m")
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def fit(probed, distribution=None, guard=None, inputs=x, own_step=False):
    model = build(distribution, own_step)
    records = []
    probe = kgrad.GradientProbe(every_n_steps=2, on_probe=records.append, statistics="all", layers="all",
                                instruments=["per_example", "optimizer"])
    callbacks = [probe] if probed else []
    callbacks += [guard] if guard is not None else []
    # 8 examples a step: the global batch, split over the devices under DataParallel.
    model.fit(inputs, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    return model, records


def guard_report(distribution=None, probed=False, own_step=False):
    """The guard's report of a NaN in the third batch's inputs (step 2), with the weights after it."""
    bad = x.copy()
    bad[2 * 8 + 5, 0] = np.nan  # an example of the second device's half of the batch
    guard = kgrad.NonFiniteGuard()
    model, _ = fit(probed, distribution, guard=guard, inputs=bad, own_step=own_step)
    report = guard.report
    return {
        "step": report.step, "tensor": report.tensor, "born_in": report.born_in, "born_at": report.born_at,
        "born_type": report.born_type, "last_finite_step": report.last_finite_step,
        "last_finite_norm": report.last_finite_norm, "batch_index": report.batch_index,
        "weights": [np.asarray(w).tolist() for w in model.get_weights()],
    }


def max_difference(a, b):
    return max(float(np.abs(u - v).max()) for u, v in zip(a.get_weights(), b.get_weights()))


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
    guarded_parallel, _ = fit(probed=False, distribution=data_parallel, guard=kgrad.NonFiniteGuard())
    _, own_one_device_records = fit(probed=True, own_step=True)
    # A NaN in the inputs of step 2 (probed): its statistics take the exact path, a host call.
    bad = x.copy()
    bad[2 * 8 + 5, 0] = np.nan
    _, nan_one_device_records = fit(probed=True, inputs=bad)
    _, nan_parallel_records = fit(probed=True, distribution=data_parallel, inputs=bad)
    own_parallel, own_parallel_records = fit(probed=True, distribution=data_parallel, own_step=True)
    own_plain_parallel, _ = fit(probed=False, distribution=data_parallel, own_step=True)
    own_guarded_parallel, _ = fit(
        probed=False, distribution=data_parallel, guard=kgrad.NonFiniteGuard(), own_step=True
    )
    json.dump({
        "devices": len(jax.devices()),
        "sharding": str(parallel.trainable_variables[0].value.sharding),
        "one_device": as_json(one_device_records),
        "data_parallel": as_json(parallel_records),
        "nan_one_device": as_json(nan_one_device_records),
        "nan_data_parallel": as_json(nan_parallel_records),
        "weight_difference": max_difference(parallel, plain_parallel),
        "guarded_weight_difference": max_difference(guarded_parallel, plain_parallel),
        "guard_one_device": guard_report(),
        "guard_data_parallel": guard_report(data_parallel),
        "guard_and_probe_data_parallel": guard_report(data_parallel, probed=True),
        "own_step": {
            "sharding": str(own_parallel.trainable_variables[0].value.sharding),
            "one_device": as_json(own_one_device_records),
            "data_parallel": as_json(own_parallel_records),
            "weight_difference": max_difference(own_parallel, own_plain_parallel),
            "guarded_weight_difference": max_difference(own_guarded_parallel, own_plain_parallel),
            "guard_one_device": guard_report(own_step=True),
            "guard_data_parallel": guard_report(data_parallel, own_step=True),
            "guard_and_probe_data_parallel": guard_report(data_parallel, probed=True, own_step=True),
        },
    }, sys.stdout)


if __name__ == "__main__":
    main()
