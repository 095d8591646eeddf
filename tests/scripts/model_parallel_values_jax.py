"""Probes and guards the same models on one device and under `ModelParallel` over 8 CPU devices.

Run by tests/jax/test_model_parallel_values_jax.py in its own process: the
number of host devices is fixed when JAX starts (``XLA_FLAGS``). The token
model and layout of tests/scripts/model_parallel_hlo_jax.py (kernels split on
both axes of a ``(2, 4)`` mesh, the embedding, the vocabulary and the heads on
``model``), with Keras' own ``train_step`` and with a model's own
(``kgrad.value_and_grad``); the probe writes ``statistics="all"``,
histograms and the optimizer, logits and attention instruments on every step.
Then the guard, on a float model split the same way, of a NaN in the inputs
of step 1, and a `kgrad.ProbingModel` of that float model whose hidden
activations pass through `kgrad.tap`. Prints one JSON object: the records of each run, Keras' own
sharded gradients (the witness of any difference), and the guard's reports.
"""

import json
import os
import sys

if __name__ == "__main__":  # (pytest imports this file for its doctests: leave its environment alone)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "jax"))
from guide_model import GuideModel  # noqa: E402  (a model with its own train_step)
from data_parallel_jax import as_json  # noqa: E402  (records as JSON)
from model_parallel_hlo_jax import build, model_parallel, targets, tokens  # noqa: E402

rng = np.random.default_rng(1)
features = rng.normal(size=(16, 32)).astype("float32")
labels = rng.normal(size=(16, 8)).astype("float32")


def probed_fit(distribution, own_step=False):
    model = build(distribution, GuideModel if own_step else keras.Model)
    records = []
    probe = kgrad.GradientProbe(every_n_steps=1, on_probe=records.append, statistics="all", histograms=True,
                                layers="all", instruments=["optimizer", "logits", "attention"])
    model.fit(tokens, targets, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[probe])
    return records


def keras_gradients(distribution):
    """Keras' own gradients of the first batch (jax.grad of its stateless loss), gathered to the host."""
    model = build(distribution)
    state = [v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables]

    def loss(trainable):
        logits, _ = model.stateless_call(trainable, state[1], tokens[:8], training=True)
        return model.loss(targets[:8], logits)

    gradients = jax.jit(jax.grad(loss))(state[0])
    return {v.path: np.asarray(g) for v, g in zip(model.trainable_variables, gradients)}


def float_model(distribution, probing=False, own_step=False):
    """The float model, compiled.

    ``probing``: a `kgrad.ProbingModel` whose hidden layer passes through `kgrad.tap`.

    ``own_step``: a `GuideModel`, whose own ``train_step`` differentiates with `kgrad.value_and_grad`.
    """
    keras.backend.clear_session()
    keras.distribution.set_distribution(distribution)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32,), name="features")
    hidden = keras.layers.Dense(64, activation="relu", name="up")(inputs)
    if probing:
        hidden = keras.layers.Lambda(lambda x: kgrad.tap("hidden", x), name="tap")(hidden)
    outputs = keras.layers.Dense(8, name="down")(hidden)
    kind = kgrad.ProbingModel if probing else GuideModel if own_step else keras.Model
    model = kind(inputs, outputs, name="p" if probing else "f")
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def guard_report(distribution):
    bad = features.copy()
    bad[8 + 6, 3] = np.nan  # step 1, an example of the second half of the batch
    guard = kgrad.NonFiniteGuard()
    model = float_model(distribution)
    model.fit(bad, labels, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    return {
        "step": report.step, "tensor": report.tensor, "born_in": report.born_in, "born_at": report.born_at,
        "last_finite_step": report.last_finite_step, "last_finite_norm": report.last_finite_norm,
        "weights": [np.asarray(w).tolist() for w in model.get_weights()],
        "sharding": str(getattr(model.get_layer("up").kernel.value.sharding, "spec", "one device")),
    }


def probing_model_records(distribution):
    """`kgrad.ProbingModel.probe_results` of each step of the float model, its hidden layer tapped."""
    model = float_model(distribution, probing=True)
    model.configure_probe(every_n_steps=1, statistics="all", histograms=True, layers="all")
    records = []
    for step in range(2):  # a fit per batch: `probe_results` holds the latest probed step only
        rows = slice(8 * step, 8 * step + 8)
        model.fit(features[rows], labels[rows], batch_size=8, epochs=1, shuffle=False, verbose=0)
        records.append(model.probe_results)
    return records


def main():
    parallel = model_parallel()
    json.dump({
        "devices": len(jax.devices()),
        "keras_step": {"one_device": as_json(probed_fit(None)), "sharded": as_json(probed_fit(parallel))},
        "own_step": {"one_device": as_json(probed_fit(None, own_step=True)),
                     "sharded": as_json(probed_fit(parallel, own_step=True))},
        "gradients": {
            "one_device": {k: v.tolist() for k, v in keras_gradients(None).items()},
            "sharded": {k: v.tolist() for k, v in keras_gradients(parallel).items()},
        },
        "guard": {"one_device": guard_report(None), "sharded": guard_report(parallel)},
        "probing_model": {"one_device": as_json(probing_model_records(None)),
                          "sharded": as_json(probing_model_records(parallel))},
    }, sys.stdout)


if __name__ == "__main__":
    main()
