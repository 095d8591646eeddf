"""TensorFlow's own steps and guard under the ``mixed_float16`` policy and a LossScaleOptimizer.

The tape differentiates the *scaled* loss, in float16; what kgrad reports is
of the true loss, in float32. What both backends share (the probe's statistics
under loss scaling, steps the scaler skips) is tested once, for both, in
tests/test_loss_scale.py. The guard's replay under loss scaling with Keras' own step
holds on both backends: tests/jax/test_mixed_precision_jax.py runs that test on JAX.
The rest is TensorFlow's: a ``train_step`` written with TensorFlow ops around a
``ProbeTape``.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from test_loss_scale import BATCH, FEATURES, mixed_float16  # noqa: F401 (mixed_float16: a fixture)
from test_loss_scale import regression_data as _data


def _model():
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    outputs = keras.layers.Dense(2, name="out")(hidden)
    return keras.Model(inputs, outputs)


def _compile(model, initial_scale, jit_compile=False):
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=initial_scale)
    model.compile(optimizer, "mse", jit_compile=jit_compile)
    return model


class _policy:
    """Sets the global dtype policy for the block."""

    def __init__(self, name):
        self._name = name

    def __enter__(self):
        self._saved = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(self._name)

    def __exit__(self, *exc_info):
        keras.mixed_precision.set_global_policy(self._saved)


class OwnStep(keras.Model):
    """The model of `_model`, with its own train_step that scales its loss as Keras' guide says."""

    def __init__(self):
        super().__init__(name="own")
        self.hidden = keras.layers.Dense(8, activation="tanh", name="hidden")
        self.out = keras.layers.Dense(2, name="out")

    def call(self, x):
        return self.out(self.hidden(x))

    def train_step(self, data):
        x, y = data
        with kgrad.ProbeTape(self) as tape:
            loss = tf.reduce_mean(tf.square(tf.cast(self(x, training=True), "float32") - y))
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return {"loss": loss}


def _fit_with_scale(make_model, initial_scale, x, y, callbacks):
    keras.utils.set_random_seed(3)
    model = _compile(make_model(), initial_scale)
    model(x[:1])
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=callbacks)
    return model


ON_TENSORFLOW = keras.config.backend() == "tensorflow"
# JAX's own step under loss scaling: tests/jax/test_own_step_loss_scale_jax.py.
_TENSORFLOW_STEP = pytest.mark.skipif(not ON_TENSORFLOW, reason="a train_step of TensorFlow ops")


@pytest.mark.parametrize(
    "make_model", [_model, pytest.param(OwnStep, marks=_TENSORFLOW_STEP)], ids=["keras_step", "own_step"]
)
def test_the_guard_reports_norms_of_the_true_loss_whatever_the_loss_scale(mixed_float16, make_model):
    x, y = _data(samples=4 * BATCH)
    x[2 * BATCH + 1, 0] = np.nan  # step 2
    reports = []
    for scale in (2.0**4, 2.0**12):
        guard = kgrad.NonFiniteGuard()
        _fit_with_scale(make_model, scale, x, y, [guard])
        reports.append(guard.report)
    assert [(r.step, r.kind, r.last_finite_step) for r in reports] == [(2, "loss", 1)] * 2
    assert [(r.replayed, r.born_in, r.born_nan_count) for r in reports] == [(True, "data", 1)] * 2
    # The loss of step 1, as a float32 mean of squares (not ~16 or ~4096 times it).
    np.testing.assert_allclose(reports[0].last_finite_norm, reports[1].last_finite_norm, rtol=1e-3)
    assert 0.05 < reports[0].last_finite_norm < 20


def test_a_probe_of_an_own_step_logs_the_true_gradients_whatever_the_loss_scale(mixed_float16):
    x, y = _data(samples=4 * BATCH)
    records = {}
    for scale in (2.0**4, 2.0**12):
        records[scale] = []
        probe = kgrad.GradientProbe(every_n_steps=1, on_probe=records[scale].append)
        model = _fit_with_scale(OwnStep, scale, x, y, [probe])
    low, high = records[2.0**4], records[2.0**12]
    assert [r.step for r in low] == [r.step for r in high] == [0, 1, 2, 3]
    for tag in ("global/grad_norm", "weight_grad_norm/hidden/kernel", "grad_norm/out"):
        np.testing.assert_allclose(
            [r.scalars[tag] for r in low], [r.scalars[tag] for r in high], rtol=2e-3, err_msg=tag
        )
    assert high[0].scalars["global/loss_scale"] == 2.0**12
    # Against a float32 tape on the same weights: the first step's gradient norm.
    keras.utils.set_random_seed(3)
    with _policy("float32"):
        reference = OwnStep()
        reference(x[:1])
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(reference(x[:BATCH]) - y[:BATCH]))
    expected = float(tf.linalg.global_norm(tape.gradient(loss, reference.trainable_variables)))
    np.testing.assert_allclose(low[0].scalars["global/grad_norm"], expected, rtol=1e-2)
    assert model.optimizer.iterations.numpy() == 4
