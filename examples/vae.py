"""A VAE with its own ``train_step``, logged by `kgrad.GradientProbe`.

Written the way Keras' VAE example writes it: the step never calls the model
itself, only ``self.encoder`` and ``self.decoder``, and builds its loss from
both (reconstruction + KL). ``kgrad.ProbeTape(self)`` in place of
``tf.GradientTape()`` captures the layers of both sub-models, which are the
model's own layers; the run is ``<log_dir>/vae/kgrad``. The data are noisy
points near a 2-D curve in 8 dimensions, made here.

Run: python examples/vae.py [LOG_DIR]
"""

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kgrad  # noqa: E402

FEATURES, LATENT = 8, 2


class Sampling(keras.layers.Layer):
    """z = mean + exp(log_var / 2) * ε, the reparametrization trick."""

    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = keras.random.normal(tf.shape(z_mean))
        return z_mean + tf.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def train_step(self, data):
        with kgrad.ProbeTape(self) as tape:  # was: tf.GradientTape()
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = tf.reduce_mean(tf.reduce_sum(tf.square(data - reconstruction), axis=1))
            kl_loss = -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
            loss = reconstruction_loss + tf.reduce_mean(tf.reduce_sum(kl_loss, axis=1))
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


def make_vae():
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(16, activation="relu", name="enc_hidden")(inputs)
    z_mean = keras.layers.Dense(LATENT, name="z_mean")(hidden)
    z_log_var = keras.layers.Dense(LATENT, name="z_log_var")(hidden)
    z = Sampling(name="sampling")([z_mean, z_log_var])
    encoder = keras.Model(inputs, [z_mean, z_log_var, z], name="encoder")
    latent = keras.Input((LATENT,))
    decoded = keras.layers.Dense(16, activation="relu", name="dec_hidden")(latent)
    decoded = keras.layers.Dense(FEATURES, name="dec_out")(decoded)
    decoder = keras.Model(latent, decoded, name="decoder")
    vae = VAE(encoder, decoder, name="vae")
    vae.compile(optimizer=keras.optimizers.Adam(1e-3))
    return vae


def curve_data(samples=512, seed=0):
    rng = np.random.default_rng(seed)
    t = rng.uniform(-1, 1, (samples, 1))
    basis = rng.normal(size=(2, FEATURES))
    points = np.concatenate([t, t**2], axis=1) @ basis
    return (points + 0.05 * rng.normal(size=points.shape)).astype("float32")


def main(log_dir):
    keras.utils.set_random_seed(0)
    vae = make_vae()
    probe = kgrad.GradientProbe(log_dir, every_n_steps=4)
    history = vae.fit(curve_data(), batch_size=64, epochs=3, verbose=0, callbacks=[probe])
    record = probe.latest
    print(f"loss {history.history['loss'][0]:.3f} -> {history.history['loss'][-1]:.3f}")
    for layer in ("enc_hidden", "z_mean", "z_log_var", "dec_hidden", "dec_out"):
        print(f"{record.tape}: step {record.step}, |dJ/d(output of {layer})| = "
              f"{record.scalars[f'grad_norm/{layer}']:.3g}")
    print(f"logs: {log_dir}; see them with: kgrad report {log_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="kgrad-vae-"))
