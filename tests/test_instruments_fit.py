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
    expected = r"must be a list of \['per_example', 'optimizer', 'logits', 'attention'\].*Received"
    with pytest.raises(ValueError, match=expected):
        kgrad.GradientProbe(instruments=instruments)


class _KernelPenalty(keras.layers.Layer):
    """Passes its input on and adds a loss on another layer's kernel (``add_loss``, not a regularizer)."""

    def __init__(self, target, **kwargs):
        super().__init__(**kwargs)
        self.target = target

    def call(self, inputs):
        self.add_loss(0.3 * keras.ops.sum(keras.ops.square(self.target.kernel)))
        return inputs


@pytest.mark.parametrize("penalty", ["kernel_regularizer", "add_loss"])
def test_the_batch_gradient_norm_leaves_out_weight_penalties(penalty):
    # ‖Σ_i ∇ℓ_i‖² is of the data loss only: a regularizer's or an add_loss
    # term's gradient is not the sum of any examples' gradients.
    keras.utils.set_random_seed(0)
    regularizer = keras.regularizers.L2(0.3) if penalty == "kernel_regularizer" else None
    hidden = keras.layers.Dense(5, activation="tanh", kernel_regularizer=regularizer, name="hidden")
    penalties = [_KernelPenalty(hidden)] if penalty == "add_loss" else []
    model = keras.Sequential([keras.Input((3,)), hidden, *penalties, keras.layers.Dense(2, name="out")])
    model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=False)
    x, y = _data()
    with tf.GradientTape() as tape:
        data_loss = keras.losses.MeanSquaredError()(y, model(x))
    data_gradients = tape.gradient(data_loss, model.trainable_weights)
    expected = {
        "hidden": sum(float(tf.reduce_sum(g * g)) for g in data_gradients[:2]),
        "out": sum(float(tf.reduce_sum(g * g)) for g in data_gradients[2:]),
    }
    assert len(model.losses) == 1  # the penalty is in the loss fit minimizes
    probe = kgrad.GradientProbe(every_n_steps=1, instruments=["per_example"])
    model.fit(x, y, batch_size=B, epochs=1, verbose=0, callbacks=[probe])
    scalars = probe.latest.scalars
    for layer, value in expected.items():
        np.testing.assert_allclose(scalars[f"noise_batch_sq_norm/{layer}"], value, rtol=1e-4)
    np.testing.assert_allclose(scalars["global/noise_batch_sq_norm"], sum(expected.values()), rtol=1e-4)
    # The weight gradient fit applied does include the penalty.
    applied = scalars["weight_grad_norm/hidden/kernel"] ** 2
    assert applied > 1.01 * float(tf.reduce_sum(data_gradients[0] ** 2))


def test_class_weights_weigh_each_examples_norm_as_keras_weighs_its_loss(tmp_path):
    # Keras turns class_weight into sample weights: ℓ_i = w[y_i]·CE_i / B.
    class_weight = {0: 1.0, 1: 3.0, 2: 0.25}
    rng = np.random.default_rng(1)
    x = rng.normal(size=(B, 3)).astype("float32")
    y = np.array([0, 1, 2, 1, 0, 2, 1, 0])

    def classifier():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh", name="hidden"),
                                  keras.layers.Dense(3, name="out")])
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    model, reference = classifier(), classifier()
    expected = {weight.path.removeprefix(f"{reference.name}/"): [] for weight in reference.trainable_weights}
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for i in range(B):
        with tf.GradientTape() as tape:
            loss = class_weight[int(y[i])] * loss_fn(y[i : i + 1], reference(x[i : i + 1])) / B
        weights = reference.trainable_weights
        for weight, gradient in zip(weights, tape.gradient(loss, weights)):
            expected[weight.path.removeprefix(f"{reference.name}/")].append(np.linalg.norm(gradient))
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["per_example"])
    model.fit(x, y, batch_size=B, epochs=1, verbose=0, callbacks=[probe], class_weight=class_weight)
    scalars = probe.latest.scalars
    for path, norms in expected.items():
        np.testing.assert_allclose(scalars[f"example_grad_norm_max/{path}"], max(norms), rtol=1e-4)
        np.testing.assert_allclose(scalars[f"example_grad_norm_mean/{path}"], np.mean(norms), rtol=1e-4)
