"""`kgrad.tap` and `kgrad.prediction_gradient` on JAX, against float64 ``jax.grad`` (model split by hand)."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad


class Tapped(keras.Model):
    """A subclassed model with a tensor that is no layer's output: ``scaled = 2·tanh(dense(x))``."""

    def __init__(self):
        super().__init__(name="tapped")
        self.dense = keras.layers.Dense(5, name="dense")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, x):
        scaled = kgrad.tap("scaled", 2.0 * keras.ops.tanh(self.dense(x)))
        return self.out(scaled)


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 3)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")


@pytest.mark.parametrize("jit_compile", [True, False], ids=["jit", "no_jit"])
def test_a_tapped_tensor_is_logged_as_jax_grad_of_the_split_model_says(jit_compile, tmp_path):
    keras.utils.set_random_seed(0)
    x, y = _data()
    model = Tapped()
    model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=jit_compile)
    model(x[:1])  # builds it
    kernel, bias, out_kernel, out_bias = [np.array(v.value, np.float64) for v in model.trainable_variables]
    x64 = x.astype(np.float64)
    scaled = 2.0 * np.tanh(x64 @ kernel + bias)

    def loss(scaled_offset):
        return jnp.mean(jnp.square((scaled + scaled_offset) @ out_kernel + out_bias - y))

    with jax.enable_x64(True):
        expected_gradient = np.asarray(jax.grad(loss)(jnp.zeros((8, 5), jnp.float64)))
    assert expected_gradient.dtype == np.float64
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=1, statistics="all")
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[probe])

    scalars = probe.latest.scalars
    assert scalars["activation_norm/scaled"] == pytest.approx(np.linalg.norm(scaled), rel=1e-4)
    assert scalars["activation_max/scaled"] == pytest.approx(scaled.max(), rel=1e-4)
    assert scalars["grad_norm/scaled"] == pytest.approx(np.linalg.norm(expected_gradient), rel=1e-4)
    assert scalars["grad_mean/scaled"] == pytest.approx(expected_gradient.mean(), rel=1e-4, abs=1e-9)
    assert scalars["grad_min/scaled"] == pytest.approx(expected_gradient.min(), rel=1e-4)
    logs = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    assert logs["grad_norm/scaled"].values[0] == pytest.approx(np.linalg.norm(expected_gradient), rel=1e-4)


def test_tap_outside_a_probed_step_returns_its_argument():
    x = jnp.ones((2, 3))
    assert kgrad.tap("anything", x) is x
    x_data, y_data = _data()
    weights = []
    for probed in (False, True):
        keras.utils.set_random_seed(0)
        model = Tapped()
        model.compile("sgd", "mse")
        callbacks = [kgrad.GradientProbe(every_n_steps=2)] if probed else []
        model.fit(x_data, y_data, batch_size=2, verbose=0, callbacks=callbacks)
        weights.append(model.get_weights())
    for plain, probed in zip(*weights):  # a tapped model trains as it does without kgrad
        np.testing.assert_array_equal(plain, probed)


def test_tap_names_a_bad_name():
    with pytest.raises(TypeError, match=r"`name` must be a non-empty string.*Received: name=3"):
        kgrad.tap(3, jnp.ones(2))


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield


def test_prediction_gradient_of_a_cross_entropy_on_probabilities(float64):
    probabilities = jax.nn.softmax(jnp.array([[1.0, 2.0, 3.0], [0.5, 0.1, -1.0]], jnp.float64))
    labels = jnp.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], jnp.float64)
    gradient = kgrad.prediction_gradient("categorical_crossentropy", labels, probabilities)
    # J = mean_i -Σ_c y_ic log(p_ic / Σ_c p_ic) (Keras renormalizes p): dJ/dp = (1/Σp - y/p) / B.
    expected = (1.0 / probabilities.sum(axis=1, keepdims=True) - labels / probabilities) / 2
    np.testing.assert_allclose(np.asarray(gradient), np.asarray(expected), rtol=1e-6)


def test_prediction_gradient_with_sample_weights_and_a_function(float64):
    prediction = jnp.array([[0.5], [2.0], [-1.0]], jnp.float64)
    target = jnp.zeros((3, 1), jnp.float64)
    weights = jnp.array([1.0, 0.0, 3.0], jnp.float64)
    gradient = kgrad.prediction_gradient(keras.losses.MeanSquaredError(), target, prediction, weights)
    # "sum_over_batch_size": Σ_i w_i (ŷ_i - y_i)² / 3.
    np.testing.assert_allclose(np.asarray(gradient)[:, 0], 2 * np.array([0.5, 0.0, -3.0]) / 3, rtol=1e-6)
    per_example = kgrad.prediction_gradient(lambda y, p: jnp.abs(p - y)[:, 0], target, prediction)
    np.testing.assert_allclose(np.asarray(per_example)[:, 0], np.sign([0.5, 2.0, -1.0]) / 3, rtol=1e-6)


def test_prediction_gradient_of_a_compiled_model_with_two_outputs():
    inputs = keras.Input((2,))
    outputs = [keras.layers.Dense(1, name="a")(inputs), keras.layers.Dense(2, name="b")(inputs)]
    model = keras.Model(inputs, outputs)
    model.compile("sgd", loss=["mse", "mae"], loss_weights=[2.0, 0.5])
    prediction = [jnp.array([[1.0], [3.0]]), jnp.array([[1.0, -1.0], [2.0, 0.5]])]  # no kink of |·| at 0
    targets = [jnp.zeros((2, 1)), jnp.zeros((2, 2))]
    got = kgrad.prediction_gradient(model, targets, prediction)

    def reference(a, b):
        return 2.0 * jnp.mean(jnp.square(a)) + 0.5 * jnp.mean(jnp.abs(b))

    expected = jax.grad(reference, argnums=(0, 1))(*prediction)
    for value, wanted in zip(got, expected):
        np.testing.assert_allclose(np.asarray(value), np.asarray(wanted), rtol=1e-6)


def test_prediction_gradient_names_a_bad_loss():
    with pytest.raises(ValueError, match=r"`loss_fn` names no Keras loss. Received: loss_fn='msee'"):
        kgrad.prediction_gradient("msee", jnp.zeros(2), jnp.zeros(2))
    with pytest.raises(TypeError, match=r"`loss_fn` must be .* Received: loss_fn=3"):
        kgrad.prediction_gradient(3, jnp.zeros(2), jnp.zeros(2))
    uncompiled = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)], name="plain")
    with pytest.raises(ValueError, match=r"model 'plain', which has no compiled loss"):
        kgrad.prediction_gradient(uncompiled, jnp.zeros((1, 1)), jnp.zeros((1, 1)))
