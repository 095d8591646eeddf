"""`NonFiniteGuard(skip_spikes=True)` on a model's own train_step: each ProbeTape judged on its own.

TensorFlow: the GAN of tests/test_custom_train_step.py (two tapes, two SGD optimizers). The real
examples of its last batch are scaled ×1000: the discriminator's loss and gradients spike, the
generator's step (noise only, through the discriminator of before) does not. The discriminator's
update is skipped, bit for bit, and the generator's is applied. JAX refuses an own train_step
(tests/jax/test_spike_skipping_jax.py).
"""

import numpy as np
import pytest
import tensorflow as tf

import kgrad
from test_custom_train_step import BATCH, _gan, _gan_data

STEPS = 24
SPIKE = STEPS - 1  # the last step: the state after fit is the state the skip kept


@pytest.fixture(scope="module")
def gan_fit(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("gan_spike")
    real, noise = _gan_data(steps=STEPS)
    real[SPIKE * BATCH :] *= 1000.0  # reals only: the discriminator's part
    gan = _gan("graph")
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16, log_dir=log_dir)
    gan.fit((real, noise), batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    before = _gan("graph")  # the same run, stopped before the spiking batch
    before.fit((real[: SPIKE * BATCH], noise[: SPIKE * BATCH]), batch_size=BATCH, shuffle=False, verbose=0)
    return guard, gan, before, real, noise, log_dir


def _state(model, optimizer):
    return [np.array(v) for v in model.weights + optimizer.variables]


def test_the_spiking_part_is_skipped_bit_for_bit_and_the_other_applied(gan_fit):
    guard, gan, before, real, noise, _ = gan_fit
    assert [(s.step, s.part) for s in guard.skipped_steps] == [(SPIKE, "discriminator")]
    assert guard.spike_report is None and guard.report is None
    assert (int(gan.d_optimizer.iterations), int(gan.g_optimizer.iterations)) == (SPIKE, STEPS)
    for kept, reference in zip(_state(gan.discriminator, gan.d_optimizer),
                               _state(before.discriminator, before.d_optimizer), strict=True):
        np.testing.assert_array_equal(kept, reference)
    # The generator's step, by hand: against the discriminator of before (its update was skipped).
    batch = noise[SPIKE * BATCH :]
    with tf.GradientTape() as tape:
        g_loss = before.loss_fn(tf.zeros((BATCH, 1)), before.discriminator(before.generator(batch)))
    weights = before.generator.trainable_weights
    grads = tape.gradient(g_loss, weights)
    for applied, weight, grad in zip(gan.generator.trainable_weights, weights, grads, strict=True):
        expected = np.array(weight) - 0.2 * np.array(grad)  # the generator's SGD(0.2)
        np.testing.assert_allclose(np.array(applied), expected, rtol=1e-5, atol=1e-7)


def test_the_skipped_parts_values_equal_a_hand_reference(gan_fit):
    guard, _, before, real, noise, _ = gan_fit
    (skipped,) = guard.skipped_steps
    fake = before.generator(noise[SPIKE * BATCH :])
    images = tf.concat([fake, real[SPIKE * BATCH :]], axis=0)
    labels = tf.concat([tf.ones((BATCH, 1)), tf.zeros((BATCH, 1))], axis=0)
    weights = before.discriminator.trainable_weights
    with tf.GradientTape() as tape:
        d_loss = before.loss_fn(labels, before.discriminator(images))
    grads = tape.gradient(d_loss, weights)
    for weight, grad in zip(weights, grads, strict=True):
        path = weight.path.removeprefix("discriminator/")
        g, w = np.array(grad, np.float64), np.array(weight, np.float64)
        np.testing.assert_allclose(skipped.values["grad_norm"][path], np.linalg.norm(g), rtol=1e-4)
        # SGD(0.1): the update is -0.1 g.
        np.testing.assert_allclose(skipped.values["update_ratio"][path],
                                   0.1 * np.linalg.norm(g) / np.linalg.norm(w), rtol=1e-4)
    assert skipped.z_scores["grad_norm"]["d_hidden/kernel"] > 6
    # The discriminator's optimizer (SGD) keeps no second moment: said, with its reason.
    assert "adam_rms" not in skipped.values and "SGD" in skipped.absent["adam_rms"]


def test_each_part_logs_its_own_rows(gan_fit):
    guard, _, _, _, _, log_dir = gan_fit
    logs = kgrad.read_logs(str(log_dir))
    for part, skipped in (("discriminator", [SPIKE]), ("generator", [])):
        flags = logs[f"kgrad/{part}"]["scalars"]["global/step_skipped"]
        assert list(flags.steps) == list(range(STEPS)) and list(np.flatnonzero(flags.values)) == skipped
    assert "skip_grad_norm/d_hidden/kernel" in logs["kgrad/discriminator"]["scalars"]


@pytest.mark.parametrize("mode", ["graph", "xla"])
def test_a_spike_that_lasts_in_one_part_stops_training_naming_the_part(mode, capsys):
    real, noise = _gan_data(steps=STEPS)
    real[20 * BATCH :] *= 1000.0
    gan = _gan(mode)
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16, max_skips=3)
    gan.fit((real, noise), batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    assert [(s.step, s.part) for s in guard.skipped_steps] == [(20, "discriminator"), (21, "discriminator"),
                                                                (22, "discriminator")]
    assert "3 steps in a row of ProbeTape 'discriminator' spiked (steps 20, 21, 22)" in str(guard.spike_report)
    assert "stopped training" in capsys.readouterr().err
    assert int(gan.d_optimizer.iterations) == 20
