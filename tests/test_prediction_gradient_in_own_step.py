"""dJ/dŷ of a `kgrad.ProbeTape` whose model ends in a layer without weights.

A GAN generator ending in ``Reshape`` is not captured by the tape's default
layers; plain ``fit`` logs its ``pred_grad_norm/output`` from the compiled
loss, and a model's own ``train_step`` must log it too, from the tape's own
backward pass. Checked against a manual `tf.GradientTape` on the same batch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad

BATCH, STEPS, LATENT = 4, 3, 3


def _generator():
    return keras.Sequential(
        [keras.Input((LATENT,)), keras.layers.Dense(6, activation="tanh", name="dense"),
         keras.layers.Reshape((2, 3), name="reshape")],
        name="generator",
    )


class Fitter(keras.Model):
    """Fits the generator's output to targets in its own train_step, with a ProbeTape."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.generator = _generator()

    def call(self, z):
        return self.generator(z)

    def train_step(self, data):
        z, target = data
        with kgrad.ProbeTape(self.generator) as tape:
            loss = tf.reduce_mean(tf.square(self.generator(z, training=True) - target))
        gradients = tape.gradient(loss, self.generator.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.generator.trainable_variables))
        return {"loss": loss}


def _model():
    keras.utils.set_random_seed(3)
    model = Fitter(name="fitter")
    model.compile(keras.optimizers.SGD(0.1), run_eagerly=False, jit_compile=False)
    model(np.zeros((1, LATENT), "float32"))
    return model


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_model_ending_in_reshape_gets_its_prediction_gradient(jit_compile, tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(BATCH * STEPS, LATENT)).astype("float32")
    target = rng.normal(size=(BATCH * STEPS, 2, 3)).astype("float32")
    probed, reference, plain = _model(), _model(), _model()
    probed.compile(keras.optimizers.SGD(0.1), jit_compile=jit_compile)
    plain.compile(keras.optimizers.SGD(0.1), jit_compile=jit_compile)
    plain.fit(z, target, batch_size=BATCH, shuffle=False, verbose=0)
    records = []
    probed.fit(z, target, batch_size=BATCH, shuffle=False, verbose=0,
               callbacks=[kgrad.GradientProbe(tmp_path, every_n_steps=1, on_probe=records.append)])
    assert len(records) == STEPS
    for step, record in enumerate(records):
        zb, tb = z[step * BATCH:(step + 1) * BATCH], target[step * BATCH:(step + 1) * BATCH]
        with tf.GradientTape() as tape:
            prediction = reference.generator(zb, training=True)
            tape.watch(prediction)
            loss = tf.reduce_mean(tf.square(prediction - tb))
        gradients = tape.gradient(loss, [prediction] + reference.generator.trainable_variables)
        reference.optimizer.apply_gradients(zip(gradients[1:], reference.generator.trainable_variables))
        expected = np.linalg.norm(gradients[0].numpy())
        np.testing.assert_allclose(record.scalars["pred_grad_norm/output"], expected, rtol=1e-5)
    # Training unchanged: the probed fit's weights are the plain fit's.
    for trained, unprobed in zip(probed.generator.weights, plain.generator.weights):
        np.testing.assert_allclose(trained.numpy(), unprobed.numpy(), rtol=1e-6, atol=1e-7)


def test_the_probe_result_holds_the_prediction_gradient():
    generator = _generator()
    z = tf.ones((2, LATENT))
    with kgrad.ProbeTape(generator) as tape:
        prediction = generator(z)
        loss = tf.reduce_sum(3.0 * prediction)
    tape.gradient(loss, generator.trainable_variables)
    assert "reshape" not in tape.probe.activations  # not captured by default
    np.testing.assert_allclose(tape.probe.prediction_gradient.numpy(), np.full((2, 2, 3), 3.0))
