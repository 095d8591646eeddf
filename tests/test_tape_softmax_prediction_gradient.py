"""`tape.probe.prediction_gradient` of a softmax/sigmoid output whose Keras cross-entropy took
the logits shortcut (docs/custom-steps.md's first snippet): the true dJ/dŷ, computed here by
hand in NumPy; and a warning, never a silent ``None``, when the loss was computed outside the block."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad


def _classifier(activation, units):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                             keras.layers.Dense(units, activation=activation, name="out")])


def _data(units):
    x = np.random.default_rng(1).normal(size=(16, 4)).astype("float32")
    if units == 1:
        return x, (np.arange(16) % 2).astype("float32")[:, None]
    return x, keras.utils.to_categorical(np.arange(16) % units, units).astype("float32")


def _by_hand(loss_name, y, p):
    """dJ/dŷ of the batch-mean cross-entropy, in NumPy (Keras normalizes p over classes first)."""
    n = len(y)
    if loss_name == "categorical":
        # J = mean_i -Σ_k y_ik log(p_ik / Σ_j p_ij): dJ/dp_ik = (-y_ik / p_ik + Σ_j y_ij / Σ_j p_ij) / n
        return (-y / p + y.sum(axis=1, keepdims=True) / p.sum(axis=1, keepdims=True)) / n
    # J = mean_i -(y log p + (1 - y) log(1 - p)) over one unit: dJ/dp = (-(y / p) + (1 - y) / (1 - p)) / n
    return (-(y / p) + (1 - y) / (1 - p)) / n


CASES = {
    "categorical": ("softmax", 3, keras.losses.CategoricalCrossentropy()),
    "binary": ("sigmoid", 1, keras.losses.BinaryCrossentropy()),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layers", [["hidden"], None])  # without and with the output captured
def test_the_prediction_gradient_is_the_true_dj_dy_inside_the_block(case, layers):
    activation, units, loss_fn = CASES[case]
    model = _classifier(activation, units)
    x, y = _data(units)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the value is there
        with kgrad.ProbeTape(model, layers=layers) as tape:
            y_pred = model(x)
            loss = loss_fn(y, y_pred)
        tape.gradient(loss, model.trainable_variables)
    assert tape.probe.prediction_gradient is not None
    np.testing.assert_allclose(tape.probe.prediction_gradient.numpy(), _by_hand(case, y, y_pred.numpy()),
                               rtol=1e-4, atol=1e-7)
    if layers is None:  # the output's dJ/d(activation) is the same tensor's gradient
        np.testing.assert_allclose(tape.probe.gradients["out"].numpy(), tape.probe.prediction_gradient.numpy(),
                                   rtol=1e-6)


def test_the_prediction_gradient_inside_a_tf_function():
    model = _classifier("softmax", 3)
    x, y = _data(3)
    loss_fn = keras.losses.CategoricalCrossentropy()

    @tf.function
    def step():
        with kgrad.ProbeTape(model, layers=["hidden"]) as tape:
            y_pred = model(x)
            loss = loss_fn(y, y_pred)
        tape.gradient(loss, model.trainable_variables)
        return y_pred, tape.probe.prediction_gradient

    y_pred, gradient = step()
    np.testing.assert_allclose(gradient.numpy(), _by_hand("categorical", y, y_pred.numpy()), rtol=1e-4, atol=1e-7)


def test_a_loss_computed_outside_the_block_warns_and_says_what_to_do():
    model = _classifier("softmax", 3)
    x, y = _data(3)
    with kgrad.ProbeTape(model, layers=["hidden"], persistent=True) as tape:
        y_pred = model(x)
    loss = keras.losses.CategoricalCrossentropy()(y, y_pred)  # outside: the tape cannot see it
    with pytest.warns(UserWarning, match=r"tape.probe.prediction_gradient is None.*kgrad.prediction_gradient"):
        tape.gradient(loss, model.trainable_variables)
    assert tape.probe.prediction_gradient is None
