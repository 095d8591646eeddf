"""NonFiniteGuard puts back what a bad step's forward pass wrote: BatchNormalization's statistics.

The reference for every check is plain Keras ``fit`` on the clean batches
before the bad one, from the same initial weights.
"""

import keras
import numpy as np
import pytest

import kgrad

BATCH = 4
BAD_ROW = 9  # in batch 2: steps 0 and 1 are clean


def _data():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.5, size=(32, 3)).astype("float32")
    y = rng.normal(size=(32, 1)).astype("float32")
    bad = x.copy()
    bad[BAD_ROW, 1] = np.nan
    return x, y, bad


def _sequential():
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, name="hidden"),
        keras.layers.BatchNormalization(name="norm"),
        keras.layers.Dense(1, name="out"),
    ])


class NormalizedRegressor(keras.Model):
    """A model with its own train_step (a ProbeTape) and a BatchNormalization layer."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(4, name="hidden")
        self.norm = keras.layers.BatchNormalization(name="norm")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, x, training=False):
        return self.out(self.norm(self.hidden(x), training=training))

    def train_step(self, data):
        x, y = data
        with kgrad.ProbeTape(self) as tape:
            loss = keras.ops.mean(keras.ops.square(self(x, training=True) - y))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return {"loss": loss}


def _own_step_model():
    keras.utils.set_random_seed(1)
    model = NormalizedRegressor(name="regressor")
    model(np.zeros((1, 3), "float32"))  # builds the layers
    return model


def _fit(model, x, y, jit_compile, steps_per_execution=1, callbacks=(), epochs=1):
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=jit_compile,
                  steps_per_execution=steps_per_execution)
    model.fit(x, y, batch_size=BATCH, shuffle=False, epochs=epochs, callbacks=list(callbacks), verbose=0)
    return model


def _assert_same_state(got, want):
    """Every weight, BatchNormalization's moving statistics included, bit for bit."""
    assert len(got.get_weights()) == len(want.get_weights())
    for a, b in zip(got.get_weights(), want.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("steps_per_execution", [1, 4])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_nan_input_before_batch_normalization_leaves_the_state_of_the_last_finite_step(
    jit_compile, steps_per_execution
):
    x, y, bad = _data()
    guard = kgrad.NonFiniteGuard()
    guarded = _fit(_sequential(), bad, y, jit_compile, steps_per_execution, [guard])
    report = guard.report
    assert report.step == 2
    # Its moving statistics, had they kept the NaN, would be blamed instead.
    assert (report.born_in, report.born_at, report.batch_index) == ("data", "input", 2)
    plain = _fit(_sequential(), x[: 2 * BATCH], y[: 2 * BATCH], jit_compile, steps_per_execution)
    _assert_same_state(guarded, plain)
    assert np.isfinite(guarded.predict(x, verbose=0)).all()


@pytest.mark.parametrize("jit_compile", [False, True])
def test_an_own_train_step_puts_back_batch_normalization_statistics_of_a_skipped_step(jit_compile):
    x, y, bad = _data()
    guard = kgrad.NonFiniteGuard()
    guarded = _fit(_own_step_model(), bad, y, jit_compile, callbacks=[guard])
    assert (guard.report.step, guard.report.born_in) == (2, "data")
    plain = _fit(_own_step_model(), x[: 2 * BATCH], y[: 2 * BATCH], jit_compile)
    _assert_same_state(guarded, plain)
    moving_mean = guarded.norm.moving_mean.numpy()
    assert np.isfinite(moving_mean).all() and np.any(moving_mean != 0)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_clean_run_with_batch_normalization_trains_like_plain_fit(jit_compile):
    x, y, _ = _data()
    guard = kgrad.NonFiniteGuard()
    guarded = _fit(_sequential(), x, y, jit_compile, callbacks=[guard], epochs=2)
    assert guard.reports == []
    _assert_same_state(guarded, _fit(_sequential(), x, y, jit_compile, epochs=2))
