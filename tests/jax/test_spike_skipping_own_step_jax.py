"""The tests of tests/test_spike_skipping_own_step.py, run on JAX: each kgrad.value_and_grad part judged.

The GAN is TensorFlow's DeterministicGAN (tests/test_custom_train_step.py) written as a JAX
``train_step``: the same layers, optimizers, data and seed, each half differentiated by
``kgrad.value_and_grad`` and applied by its optimizer's ``stateless_apply``. The hand
references differentiate the models with ``jax.grad`` of ``stateless_call``. A part whose
values no single ``stateless_apply`` applies is refused, naming it.
"""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad
from fit_helpers import gan_models
from guide_model import GuideModel

from test_spike_skipping_own_step import (  # noqa: F401 (collected here, in the JAX run)
    gan_fit,
    test_a_parts_spike_beyond_float32s_squares_is_skipped,
    test_a_clean_own_step_reads_its_spike_states_at_each_epochs_end_only,
    test_a_skipped_part_is_read_after_its_batch_and_at_each_epochs_end,
    test_a_spike_that_lasts_in_one_part_stops_training_naming_the_part,
    test_each_part_logs_its_own_rows,
    test_the_skipped_parts_values_equal_a_hand_reference,
    test_the_spiking_part_is_skipped_bit_for_bit_and_the_other_applied,
    test_a_probed_step_judges_each_part_as_an_unprobed_one,
)

BATCH = 8  # tests/test_custom_train_step.py's


class DeterministicGAN(keras.Model):
    """tests/test_custom_train_step.py's GAN, with its own JAX ``train_step`` (noise from the data).

    Its discriminator outputs logits, and its loss takes them: the loss TensorFlow computes.
    """

    def __init__(self):
        super().__init__(name="gan")
        self.discriminator, self.generator = gan_models(d_activation=None)  # logits: see `compile`
        self.built = True

    def compile(self, **kwargs):
        super().compile(**kwargs)
        self.d_optimizer = keras.optimizers.SGD(0.1)
        self.g_optimizer = keras.optimizers.SGD(0.2)
        # TensorFlow's Keras computes the BCE of a sigmoid from its logits (TensorFlow's GAN's loss
        # does); JAX's would clip the sigmoid's saturated outputs, whose gradients then vanish.
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
        self.d_optimizer.build(self.discriminator.trainable_variables)
        self.g_optimizer.build(self.generator.trainable_variables)
        self.optimizer_state = self.d_optimizer.variables + self.g_optimizer.variables

    def d_loss(self, d_trainable, d_non_trainable, g_values, real, noise):
        fake, _ = self.generator.stateless_call(*g_values, noise)
        images = jnp.concatenate([fake, real])
        labels = jnp.concatenate([jnp.ones((len(real), 1)), jnp.zeros((len(real), 1))])
        predictions, _ = self.discriminator.stateless_call(d_trainable, d_non_trainable, images)
        return self.loss_fn(labels, predictions)

    def g_loss(self, g_trainable, g_non_trainable, d_values, noise):
        fake, _ = self.generator.stateless_call(g_trainable, g_non_trainable, noise)
        predictions, _ = self.discriminator.stateless_call(*d_values, fake)
        return self.loss_fn(jnp.zeros((len(noise), 1)), predictions)

    def train_step(self, state, data):
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        (real, noise), _, _ = keras.utils.unpack_x_y_sample_weight(data)
        where = {id(v): i for i, v in enumerate(self.trainable_variables)}
        values = list(trainable)
        extra = {id(v): i for i, v in enumerate(self.non_trainable_variables)}
        non_trainable = list(non_trainable)
        of = lambda variables: [values[where[id(v)]] for v in variables]  # noqa: E731
        state_of = lambda variables: [non_trainable[extra[id(v)]] for v in variables]  # noqa: E731
        d, g = self.discriminator, self.generator

        d_loss, grads = kgrad.value_and_grad(self.d_loss)(
            of(d.trainable_variables), [], (of(g.trainable_variables), []), real, noise
        )
        d_new, d_state = self.d_optimizer.stateless_apply(
            state_of(self.d_optimizer.variables), grads, of(d.trainable_variables)
        )
        for variable, value in zip(d.trainable_variables, d_new):
            values[where[id(variable)]] = value
        g_loss, grads = kgrad.value_and_grad(self.g_loss)(
            of(g.trainable_variables), [], (of(d.trainable_variables), []), noise
        )
        g_new, g_state = self.g_optimizer.stateless_apply(
            state_of(self.g_optimizer.variables), grads, of(g.trainable_variables)
        )
        for variable, value in zip(g.trainable_variables, g_new):
            values[where[id(variable)]] = value
        for variables, new in ((self.d_optimizer.variables, d_state), (self.g_optimizer.variables, g_state)):
            for variable, value in zip(variables, new):
                non_trainable[extra[id(variable)]] = value
        state = (values, non_trainable, optimizer_variables, metrics_variables)
        return {"d_loss": d_loss, "g_loss": g_loss}, state


def _grads(model, loss_of_outputs, inputs):
    """``[dJ/dw]`` of ``model``'s trainable weights, by ``jax.grad`` of its ``stateless_call``."""
    def loss(trainable):
        outputs, _ = model.stateless_call(trainable, [v.value for v in model.non_trainable_variables], inputs)
        return loss_of_outputs(outputs)

    return jax.grad(loss)([v.value for v in model.trainable_variables])


class _JaxGAN:
    """The GAN and its hand references on JAX (see `test_spike_skipping_own_step._TensorFlowGAN`)."""

    batch = BATCH
    fit_compiled = True  # the module's fit: jitted (op by op, JAX's costs 5x the CPU)
    reads_when_computed = True  # the count of skips, read in Keras' worker thread once computed

    @staticmethod
    def forbid_other_host_reads(monkeypatch, reading):
        """JAX's guard keeps no variables: its record is read only through `SpikeSkipping.read`."""

    @staticmethod
    def make(compiled):
        keras.utils.set_random_seed(2)
        gan = DeterministicGAN()
        gan.compile(jit_compile=compiled)
        return gan

    @staticmethod
    def data(steps):
        rng = np.random.default_rng(3)
        real = rng.normal(size=(BATCH * steps, 2)).astype("float32")
        noise = rng.normal(size=(BATCH * steps, 3)).astype("float32")
        return real, noise

    @staticmethod
    def d_grads(gan, images, labels):
        return _grads(gan.discriminator, lambda outputs: gan.loss_fn(labels, outputs), images)

    @staticmethod
    def g_grads(gan, noise):
        def loss(fake):
            predictions = gan.discriminator(fake)
            return gan.loss_fn(jnp.zeros((len(noise), 1)), predictions)

        return _grads(gan.generator, loss, noise)


@pytest.fixture(scope="module")
def gan_kit():
    return _JaxGAN


class _CopiedWeights(GuideModel):
    """Differentiates copies of its weights: no ``stateless_apply`` applies that part's values."""

    differentiate = staticmethod(lambda trainable_variables: [v + 0 for v in trainable_variables])


def test_a_part_not_applied_as_one_update_is_refused_naming_it():
    inputs = keras.Input((2,))
    model = _CopiedWeights(inputs, keras.layers.Dense(1)(inputs), name="copied")
    model.compile("sgd", "mse")
    guard = kgrad.NonFiniteGuard(skip_spikes=True)
    with pytest.raises(ValueError, match=r"part\(s\) \[.*\] of the train_step of model 'copied' were not "
                                         r"applied by one optimizer.stateless_apply.*skip_spikes=False"):
        model.fit(np.zeros((4, 2)), np.zeros((4, 1)), verbose=0, callbacks=[guard])
