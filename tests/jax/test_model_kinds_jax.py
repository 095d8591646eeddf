"""Subclassed and nested models on JAX: the layers' names and values, against a float64 ``jax.grad``."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad

BATCH, FEATURES, HIDDEN = 8, 3, 4


class Subclassed(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(HIDDEN, activation="tanh", name="hidden")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, x):
        return self.out(self.hidden(x))


def _nested():
    inner = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh", name="hidden")], name="inner"
    )
    inputs = keras.Input((FEATURES,))
    return keras.Model(inputs, keras.layers.Dense(1, name="out")(inner(inputs)), name="outer")


def _reference(kernel1, bias1, kernel2, bias2, x, y):
    with jax.enable_x64(True):

        def loss(d_hidden, d_out, k1):
            hidden = jnp.tanh(x @ k1 + bias1) + d_hidden
            out = hidden @ kernel2 + bias2 + d_out
            return jnp.mean(jnp.square(out - y))

        zeros = (jnp.zeros((BATCH, HIDDEN)), jnp.zeros((BATCH, 1)))
        d_hidden, d_out, d_kernel = jax.grad(loss, argnums=(0, 1, 2))(*zeros, jnp.asarray(kernel1))
        return {
            "hidden": float(jnp.linalg.norm(d_hidden)),
            "out": float(jnp.linalg.norm(d_out)),
            "kernel": float(jnp.linalg.norm(d_kernel)),
        }


@pytest.mark.parametrize("kind", ["subclassed", "nested"])
def test_layers_of_subclassed_and_nested_models_are_probed_by_name(kind, tmp_path):
    keras.utils.set_random_seed(0)
    model = Subclassed(name="sub") if kind == "subclassed" else _nested()
    model(np.zeros((1, FEATURES), "float32"))  # builds a subclassed model's layers
    model.compile(keras.optimizers.SGD(0.1), "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, FEATURES)).astype("float32")
    y = rng.normal(size=(BATCH, 1)).astype("float32")
    weights = [np.asarray(w, np.float64) for w in model.get_weights()]
    records = []
    model.fit(
        x,
        y,
        batch_size=BATCH,
        verbose=0,
        callbacks=[kgrad.GradientProbe(str(tmp_path), on_probe=records.append)],
    )
    (record,) = records
    expected = _reference(*weights, x.astype(np.float64), y.astype(np.float64))
    kernel = "hidden/kernel" if kind == "subclassed" else "inner/hidden/kernel"
    assert record.scalars["grad_norm/hidden"] == pytest.approx(expected["hidden"], rel=1e-4)
    assert record.scalars["grad_norm/out"] == pytest.approx(expected["out"], rel=1e-4)
    assert record.scalars[f"weight_grad_norm/{kernel}"] == pytest.approx(expected["kernel"], rel=1e-4)
