"""GradientProbe(instruments=["per_example"]) inside model.fit, against a per-example loop."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad

B = 8


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(5, activation="tanh", name="hidden"),
        keras.layers.Dense(2, name="out"),
    ])
    model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=False)
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(B, 3)).astype("float32"), rng.normal(size=(B, 2)).astype("float32")


def _per_example_norms(model, x, y):
    """‖∇_w ℓ_i‖ with ℓ_i = loss_i / B (Keras' sum_over_batch_size), one tape per example."""
    norms = {weight.path.removeprefix(f"{model.name}/"): [] for weight in model.trainable_weights}
    for i in range(B):
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(y[i : i + 1], model(x[i : i + 1])) / B
        for weight, gradient in zip(model.trainable_weights, tape.gradient(loss, model.trainable_weights)):
            norms[weight.path.removeprefix(f"{model.name}/")].append(np.linalg.norm(gradient))
    return {path: np.array(values) for path, values in norms.items()}


@pytest.mark.parametrize("jit_compile", [False, True])
def test_per_example_norms_in_fit_equal_a_per_example_loop(tmp_path, jit_compile):
    x, y = _data()
    model, reference = _model(), _model()
    model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=jit_compile)
    expected = _per_example_norms(reference, x, y)
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["per_example"])
    model.fit(x, y, batch_size=B, epochs=1, verbose=0, callbacks=[probe])
    scalars = probe.latest.scalars
    for path, norms in expected.items():
        np.testing.assert_allclose(scalars[f"example_grad_norm_max/{path}"], norms.max(), rtol=1e-4)
        np.testing.assert_allclose(scalars[f"example_grad_norm_mean/{path}"], norms.mean(), rtol=1e-4)
    assert {"global/noise_example_sq_norm_mean", "global/noise_batch_sq_norm"} <= set(scalars)
    logged = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    assert "noise_batch_sq_norm/hidden" in logged


def test_without_the_option_no_per_example_tags():
    x, y = _data()
    probe = kgrad.GradientProbe(every_n_steps=1)
    _model().fit(x, y, batch_size=B, verbose=0, callbacks=[probe])
    assert not any(tag.startswith(("example_grad_norm", "noise_")) for tag in probe.latest.scalars)


def test_batch_normalization_gets_no_per_example_norms_and_a_warning():
    model = keras.Sequential([
        keras.Input((3,)), keras.layers.Dense(4, name="hidden"),
        keras.layers.BatchNormalization(name="norm"), keras.layers.Dense(2, name="out"),
    ])
    model.compile("sgd", "mse", jit_compile=False)
    x, y = _data()
    probe = kgrad.GradientProbe(every_n_steps=1, instruments=["per_example"])
    with pytest.warns(UserWarning, match="no per-example gradient norms for .*'norm'"):
        model.fit(x, y, batch_size=B, verbose=0, callbacks=[probe])
    assert not any(tag.startswith("example_grad_norm") for tag in probe.latest.scalars)


@pytest.mark.parametrize("instruments", ["per_example", ["noise"], 3])
def test_instruments_must_be_a_list_of_known_names(instruments):
    with pytest.raises(ValueError, match=r"`instruments` must be a list of \['per_example'\].*Received"):
        kgrad.GradientProbe(instruments=instruments)
