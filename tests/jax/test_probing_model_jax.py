"""`kgrad.ProbingModel` on JAX: the probed step built into the model, without a callback.

What holds on both backends (functional and subclassed models, `configure_probe`, saving and
loading, a `GradientProbe` passed to fit) is tested once, in tests/test_probing_model.py, run
here too; these tests check JAX's values against ``jax.grad`` and what JAX alone refuses.
"""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad
from test_probing_model import (  # noqa: F401 (collected here, in the JAX run)
    test_configure_probe_rejects_bad_options,
    test_configure_probe_selects_layers_captures_and_schedule,
    test_functional_probing_model_probes_every_step_by_default,
    test_gradient_probe_on_a_probing_model_then_its_own_probe_again,
    test_save_and_load_model,
    test_subclassing_still_works_after_a_functional_probing_model_exists,
)


def _data(samples=16):
    rng = np.random.default_rng(0)
    return rng.normal(size=(samples, 4)).astype("float32"), rng.normal(size=(samples, 1)).astype("float32")


def _layers(inputs):
    hidden = keras.layers.Dense(6, activation="tanh", name="hidden")(inputs)
    return keras.layers.Dense(1, name="out")(hidden)


def _functional(cls):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,), name="x")
    model = cls(inputs, _layers(inputs), name="m")
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def test_probe_results_equal_jax_grad_of_the_split_model_and_training_is_unchanged():
    x, y = _data(4)
    model = _functional(kgrad.ProbingModel)
    assert isinstance(model, kgrad.ProbingModel) and isinstance(model, keras.Model)
    model.configure_probe(every_n_steps=1, statistics="all")
    kernel, bias, out_kernel, out_bias = [np.array(v.value, np.float64) for v in model.trainable_variables]
    hidden = np.tanh(x.astype(np.float64) @ kernel + bias)

    def loss(offset):
        return jnp.mean(jnp.square((hidden + offset) @ out_kernel + out_bias - y))

    with jax.enable_x64(True):
        hidden_gradient = np.asarray(jax.grad(loss)(jnp.zeros_like(hidden)))
    model.fit(x, y, batch_size=4, verbose=0)
    plain = _functional(keras.Model)
    plain.fit(x, y, batch_size=4, verbose=0)

    record = model.probe_results
    assert record.step == 0
    assert record.scalars["activation_norm/hidden"] == pytest.approx(np.linalg.norm(hidden), rel=1e-4)
    assert record.scalars["grad_norm/hidden"] == pytest.approx(np.linalg.norm(hidden_gradient), rel=1e-4)
    assert record.scalars["weight_grad_norm/out/kernel"] == pytest.approx(
        np.linalg.norm(hidden.T @ (2 * (hidden @ out_kernel + out_bias - y) / 4)), rel=1e-4
    )
    for probed, unprobed in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(probed, unprobed)


def test_probed_steps_are_every_n_th_across_fits():
    x, y = _data(12)
    model = _functional(kgrad.ProbingModel)
    model.configure_probe(every_n_steps=4, layers=["hidden"])
    model.fit(x, y, batch_size=2, verbose=0)  # steps 0..5: step 4 probed last
    assert model.probe_results.step == 4
    model.fit(x[:6], y[:6], batch_size=2, verbose=0)  # steps 6..8: step 8 probed
    assert model.probe_results.step == 8
    scalars = model.probe_results.scalars
    assert "grad_norm/hidden" in scalars and "grad_norm/out" not in scalars


def test_a_probing_model_with_its_own_train_step_says_what_to_use():
    class Own(kgrad.ProbingModel):
        def train_step(self, state, data):
            return super().train_step(state, data)

    inputs = keras.Input((4,))
    model = Own(inputs, _layers(inputs))
    model.compile("sgd", "mse")
    x, y = _data(4)
    with pytest.raises(kgrad.UnsupportedBackendError, match=r"its own train_step.*kgrad.value_and_grad"):
        model.fit(x, y, verbose=0)
