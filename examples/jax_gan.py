"""A GAN with its own JAX ``train_step``, its two sub-models logged by `kgrad.GradientProbe`.

Written the way Keras' guide "Customizing what happens in fit() with JAX"
writes a stateless step: ``stateless_call`` inside a loss function,
``jax.value_and_grad(..., has_aux=True)`` over it, ``stateless_apply`` of an
optimizer; here twice, for a discriminator and a generator, each with its own
optimizer. The only change for kgrad is ``jax.value_and_grad`` ->
``kgrad.value_and_grad`` (two lines). Each becomes a TensorBoard run,
``<log_dir>/discriminator/kgrad`` and ``<log_dir>/generator/kgrad``, with the
tags TensorFlow's examples/gan.py writes; ``kgrad report <log_dir>`` prints
one table per sub-model. The data are points on a ring, made here.

Run: KERAS_BACKEND=jax python examples/jax_gan.py [LOG_DIR]
"""

import os
import sys
import tempfile

if __name__ == "__main__":  # this example's train_step is JAX's (imported by a test, it leaves the
    os.environ["KERAS_BACKEND"] = "jax"  # environment alone: subprocesses of a TensorFlow run inherit it)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402

LATENT = 4


class GAN(keras.Model):
    def __init__(self, discriminator, generator):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.seed_generator = keras.random.SeedGenerator(1337)
        self.built = True

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn
        d_optimizer.build(self.discriminator.trainable_variables)
        g_optimizer.build(self.generator.trainable_variables)
        # JAX's fit carries the model's variables through the step as its state:
        # the optimizers' variables travel with the model's non-trainable ones.
        self.optimizer_state = d_optimizer.variables + g_optimizer.variables

    def compute_d_loss(self, d_trainable, d_non_trainable, g_values, real, noise):
        fake, _ = self.generator.stateless_call(*g_values, noise)
        images = jnp.concatenate([fake, real])
        labels = jnp.concatenate([jnp.ones((len(real), 1)), jnp.zeros((len(real), 1))])
        predictions, d_non_trainable = self.discriminator.stateless_call(
            d_trainable, d_non_trainable, images, training=True
        )
        return self.loss_fn(labels, predictions), d_non_trainable

    def compute_g_loss(self, g_trainable, g_non_trainable, d_values, noise):
        fake, g_non_trainable = self.generator.stateless_call(
            g_trainable, g_non_trainable, noise, training=True
        )
        predictions, _ = self.discriminator.stateless_call(*d_values, fake)
        misleading = jnp.zeros((len(noise), 1))
        return self.loss_fn(misleading, predictions), g_non_trainable

    def train_step(self, state, data):
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        values = _Values(self, trainable, non_trainable)
        real = data
        d_noise_seed, g_noise_seed, next_seed = jax.random.split(values.get(self.seed_generator.state), 3)
        noise = jax.random.normal(d_noise_seed, (len(real), LATENT))

        grad_fn = kgrad.value_and_grad(self.compute_d_loss, has_aux=True)  # was: jax.value_and_grad
        d = self.discriminator
        (d_loss, d_non_trainable), grads = grad_fn(
            values.of(d.trainable_variables), values.of(d.non_trainable_variables),
            values.model(self.generator), real, noise,
        )
        d_trainable, d_optimizer_values = self.d_optimizer.stateless_apply(
            values.of(self.d_optimizer.variables), grads, values.of(d.trainable_variables)
        )
        values.set(d.trainable_variables, d_trainable)
        values.set(d.non_trainable_variables, d_non_trainable)
        values.set(self.d_optimizer.variables, d_optimizer_values)

        noise = jax.random.normal(g_noise_seed, (len(real), LATENT))
        grad_fn = kgrad.value_and_grad(self.compute_g_loss, has_aux=True)  # was: jax.value_and_grad
        g = self.generator
        (g_loss, g_non_trainable), grads = grad_fn(
            values.of(g.trainable_variables), values.of(g.non_trainable_variables),
            values.model(self.discriminator), noise,
        )
        g_trainable, g_optimizer_values = self.g_optimizer.stateless_apply(
            values.of(self.g_optimizer.variables), grads, values.of(g.trainable_variables)
        )
        values.set(g.trainable_variables, g_trainable)
        values.set(g.non_trainable_variables, g_non_trainable)
        values.set(self.g_optimizer.variables, g_optimizer_values)
        values.set([self.seed_generator.state], [next_seed])
        state = (values.trainable, values.non_trainable, optimizer_variables, metrics_variables)
        return {"d_loss": d_loss, "g_loss": g_loss}, state


class _Values:
    """The step's values of the model's variables, looked up and replaced by variable."""

    def __init__(self, model, trainable, non_trainable):
        self.trainable, self.non_trainable = list(trainable), list(non_trainable)
        self._where = {id(v): (self.trainable, i) for i, v in enumerate(model.trainable_variables)}
        self._where.update(
            {id(v): (self.non_trainable, i) for i, v in enumerate(model.non_trainable_variables)}
        )

    def get(self, variable):
        values, index = self._where[id(variable)]
        return values[index]

    def of(self, variables):
        return [self.get(variable) for variable in variables]

    def model(self, sub_model):
        return self.of(sub_model.trainable_variables), self.of(sub_model.non_trainable_variables)

    def set(self, variables, new_values):
        for variable, value in zip(variables, new_values):
            values, index = self._where[id(variable)]
            values[index] = value


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
    for part, record in sorted(probe.latest_by_tape.items()):
        hidden = "d_hidden" if part == "discriminator" else "g_hidden"
        print(
            f"{part}: step {record.step}, |dJ/d(activation)| of {hidden} = "
            f"{record.scalars[f'grad_norm/{hidden}']:.3g}, "
            f"|dJ/dw| of {hidden}/kernel = {record.scalars[f'weight_grad_norm/{hidden}/kernel']:.3g}"
        )
    print(f"logs: {log_dir} (runs {', '.join(sorted(probe.latest_by_tape))}); "
          f"see them with: kgrad report {log_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="kgrad-jax-gan-"))
