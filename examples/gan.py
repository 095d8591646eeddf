"""A GAN with its own ``train_step``, its two tapes logged by `kgrad.GradientProbe`.

Written the way Keras' guide "Customizing what happens in fit()" writes its
GAN: a discriminator and a generator, two optimizers, two tapes. The only
change for kgrad is ``tf.GradientTape()`` -> ``kgrad.ProbeTape(sub_model)``.
Each tape becomes a TensorBoard run of its own, ``<log_dir>/discriminator/kgrad``
and ``<log_dir>/generator/kgrad``, logged at the ``iterations`` of the
optimizer that applied its gradients; ``kgrad report <log_dir>`` prints one
table per tape. The data are points on a ring, made here.

Run: python examples/gan.py [LOG_DIR]
"""

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kgrad  # noqa: E402

LATENT = 4


class GAN(keras.Model):
    def __init__(self, discriminator, generator):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, real):
        batch_size = tf.shape(real)[0]
        noise = keras.random.normal((batch_size, LATENT), seed=None)
        fake = self.generator(noise)
        images = tf.concat([fake, real], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        with kgrad.ProbeTape(self.discriminator) as tape:  # was: tf.GradientTape()
            d_loss = self.loss_fn(labels, self.discriminator(images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))

        noise = keras.random.normal((batch_size, LATENT), seed=None)
        misleading = tf.zeros((batch_size, 1))
        with kgrad.ProbeTape(self.generator) as tape:  # was: tf.GradientTape()
            g_loss = self.loss_fn(misleading, self.discriminator(self.generator(noise)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


def make_gan():
    discriminator = keras.Sequential([
        keras.Input((2,)),
        keras.layers.Dense(32, activation="relu", name="d_hidden"),
        keras.layers.Dense(1, activation="sigmoid", name="d_out"),
    ], name="discriminator")
    generator = keras.Sequential([
        keras.Input((LATENT,)),
        keras.layers.Dense(32, activation="relu", name="g_hidden"),
        keras.layers.Dense(2, name="g_out"),
    ], name="generator")
    gan = GAN(discriminator, generator)
    gan.compile(
        d_optimizer=keras.optimizers.Adam(1e-3),
        g_optimizer=keras.optimizers.Adam(1e-3),
        loss_fn=keras.losses.BinaryCrossentropy(),
    )
    return gan


def ring(samples=512, seed=0):
    angles = np.random.default_rng(seed).uniform(0, 2 * np.pi, samples)
    return np.stack([np.cos(angles), np.sin(angles)], axis=1).astype("float32")


def main(log_dir):
    keras.utils.set_random_seed(0)
    gan = make_gan()
    probe = kgrad.GradientProbe(log_dir, every_n_steps=4)
    gan.fit(ring(), batch_size=64, epochs=3, verbose=0, callbacks=[probe])
    for tape, record in sorted(probe.latest_by_tape.items()):
        hidden = "d_hidden" if tape == "discriminator" else "g_hidden"
        print(
            f"{tape}: step {record.step}, |dJ/d(activation)| of {hidden} = "
            f"{record.scalars[f'grad_norm/{hidden}']:.3g}, "
            f"|dJ/dw| of {hidden}/kernel = {record.scalars[f'weight_grad_norm/{hidden}/kernel']:.3g}"
        )
    print(f"logs: {log_dir} (runs {', '.join(sorted(probe.latest_by_tape))}); "
          f"see them with: kgrad report {log_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="kgrad-gan-"))
