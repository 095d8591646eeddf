"""README example 2 (a TensorFlow-style ``train_step(self, data)``) on JAX: refused before fit
starts, saying what to write, not a TypeError through kgrad's frames at the first step."""

import keras
import numpy as np
import pytest

import kgrad


class OneArgumentStep(keras.Model):
    """README example 2's step, written for TensorFlow (the tape is never reached on JAX)."""

    def train_step(self, data):
        raise AssertionError("fit must not start")


def _model():
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    model = OneArgumentStep(inputs, keras.layers.Dense(1, name="out")(hidden), name="regressor")
    model.compile("sgd", "mse")
    return model


@pytest.mark.parametrize("callback", ["GradientProbe", "NonFiniteGuard"])
def test_a_one_argument_train_step_is_explained_before_fit_starts(tmp_path, callback):
    x = np.random.normal(size=(64, 8)).astype("float32")
    made = kgrad.GradientProbe(str(tmp_path / "logs"), every_n_steps=4) if callback == "GradientProbe" \
        else kgrad.NonFiniteGuard()
    with pytest.raises(TypeError) as error:
        _model().fit(x, x.sum(axis=1), epochs=1, verbose=0, callbacks=[made])
    message = str(error.value)
    assert message.startswith("OneArgumentStep.train_step(self, data) takes the batch alone")
    assert "train_step(state, data)" in message and "kgrad.value_and_grad" in message
    assert f"kgrad.{callback}(...)" in message and "KERAS_BACKEND=tensorflow" in message
    # Raised from kgrad's check, before Keras ran a step.
    assert error.traceback[-1].name == "check_stateless_train_step"
    assert not (tmp_path / "logs").exists()


def test_a_stateless_train_step_passes_the_check():
    from kgrad.backends.common.own_step import check_stateless_train_step

    class Stateless(keras.Model):
        def train_step(self, state, data):
            return {}, state

    check_stateless_train_step(Stateless(), "GradientProbe")  # no error
