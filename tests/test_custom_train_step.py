"""GradientProbe on models with their own train_step: a softmax classifier, a GAN, a VAE.

Every logged value is compared with a manual `tf.GradientTape` on the same
model split by hand, step by step, and the weights with the same fit without
kgrad.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from fit_helpers import gan_models
from test_no_host_sync import (  # noqa: F401 (device_reads is a fixture)
    EPOCHS, EVERY_N_STEPS, STEPS_PER_EPOCH, _EventLog, _expected_read_points, _read_points, device_reads,
)

FEATURES, CLASSES, BATCH, STEPS = 4, 3, 8, 6
MODES = {
    "eager": dict(run_eagerly=True, jit_compile=False),
    "graph": dict(run_eagerly=False, jit_compile=False),
    "xla": dict(run_eagerly=False, jit_compile=True),
}


class Classifier(keras.Model):
    """Softmax classifier whose own train_step uses a ProbeTape."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="tanh", name="hidden")
        self.scores = keras.layers.Dense(CLASSES, activation="softmax", name="scores")
        self.loss_fn = keras.losses.CategoricalCrossentropy()

    def call(self, x):
        return self.scores(self.hidden(x))

    def train_step(self, data):
        x, y = data
        with kgrad.ProbeTape(self, watch_inputs=True) as tape:
            loss = self.loss_fn(y, self(x, training=True))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return {"loss": loss}


def _data(samples=BATCH * STEPS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, FEATURES)).astype("float32")
    y = np.eye(CLASSES, dtype="float32")[rng.integers(0, CLASSES, samples)]
    return x, y


def _classifier(mode, steps_per_execution=1):
    keras.utils.set_random_seed(1)
    model = Classifier(name="classifier")
    model.compile(keras.optimizers.SGD(0.5), steps_per_execution=steps_per_execution, **MODES[mode])
    model(np.zeros((1, FEATURES), "float32"))  # builds the layers
    return model


def _reference_classifier_records(model, x, y):
    """Per step: the tags a probe logs, computed with a manual tape on the split model."""
    references = []
    for start in range(0, len(x), BATCH):
        xb, yb = tf.constant(x[start : start + BATCH]), tf.constant(y[start : start + BATCH])
        weights = model.trainable_variables
        before = [w.numpy().copy() for w in weights]
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(xb)
            hidden = model.hidden(xb)
            probabilities = model.scores(hidden)
            loss = model.loss_fn(yb, probabilities)
        weight_gradients = tape.gradient(loss, weights)
        p = probabilities.numpy()
        # Keras' CCE on probabilities renormalizes them: dJ/dp = (1 - y/p) / B.
        prediction_gradient = (1.0 - yb.numpy() / p) / BATCH
        record = {
            "grad_norm/hidden": np.linalg.norm(tape.gradient(loss, hidden)),
            "grad_norm/scores": np.linalg.norm(prediction_gradient),
            "pred_grad_norm/output": np.linalg.norm(prediction_gradient),
            "input_grad_norm/input": np.linalg.norm(tape.gradient(loss, xb)),
            "activation_norm/hidden": np.linalg.norm(hidden),
            "global/grad_norm": np.sqrt(sum(np.sum(g.numpy() ** 2) for g in weight_gradients)),
        }
        model.optimizer.apply_gradients(zip(weight_gradients, weights))
        for weight, gradient, old in zip(weights, weight_gradients, before):
            path = weight.path.removeprefix("classifier/")
            record[f"weight_grad_norm/{path}"] = np.linalg.norm(gradient)
            record[f"weight_norm/{path}"] = np.linalg.norm(old)
            change = np.linalg.norm(weight.numpy() - old)
            # kgrad's convention for a weight that was all zeros: ratio 1 if it moved.
            record[f"update_ratio/{path}"] = change / np.linalg.norm(old) if old.any() else float(change > 0)
        references.append(record)
    return references


@pytest.mark.parametrize("mode", list(MODES))
def test_softmax_classifier_with_its_own_step_logs_true_values_and_trains_unchanged(mode, tmp_path):
    x, y = _data()
    probed = _classifier(mode)
    reference_model = _classifier(mode)
    plain = _classifier(mode)
    records = []
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, on_probe=records.append, statistics="all")
    probed.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
    plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    references = _reference_classifier_records(reference_model, x, y)

    assert [record.step for record in records] == list(range(STEPS))
    assert {record.tape for record in records} == {"classifier"}
    for record, reference in zip(records, references):
        for tag, expected in reference.items():
            np.testing.assert_allclose(record.scalars[tag], expected, rtol=1e-5, err_msg=tag)
    for probed_weight, plain_weight in zip(probed.weights, plain.weights):
        np.testing.assert_allclose(probed_weight.numpy(), plain_weight.numpy(), rtol=1e-6, atol=1e-7)
    logs = kgrad.read_logs(tmp_path)
    assert list(logs) == ["classifier/kgrad"]
    steps, values = logs["classifier/kgrad"]["scalars"]["grad_norm/scores"]
    assert steps.tolist() == list(range(STEPS))
    np.testing.assert_allclose(values, [r["grad_norm/scores"] for r in references], rtol=1e-5)
    assert "grad_hist/hidden" in logs["classifier/kgrad"]["histograms"]


def test_softmax_output_gradient_equals_a_float64_finite_difference():
    x, y = _data(samples=BATCH)
    model = _classifier("graph")
    with kgrad.ProbeTape(model) as tape:
        loss = model.loss_fn(y, model(x))
    tape.gradient(loss, model.trainable_variables)
    p = tape.probe.activations["scores"].numpy().astype("float64")

    def cce(probabilities):  # Keras' CCE on probabilities, in float64
        normalized = probabilities / probabilities.sum(axis=1, keepdims=True)
        return np.mean(-np.sum(y * np.log(normalized), axis=1))

    numeric = np.zeros_like(p)
    for index in np.ndindex(p.shape):
        step = np.zeros_like(p)
        step[index] = 1e-6
        numeric[index] = (cce(p + step) - cce(p - step)) / 2e-6
    np.testing.assert_allclose(tape.probe.gradients["scores"].numpy(), numeric, rtol=1e-4, atol=1e-6)


def test_steps_per_execution_probes_every_nth_step_in_a_branch(tmp_path):
    x, y = _data(samples=BATCH * 9)
    probed, reference = _classifier("graph", steps_per_execution=3), _classifier("graph")
    records = []
    probe = kgrad.GradientProbe(None, every_n_steps=2, on_probe=records.append)
    probed.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
    references = _reference_classifier_records(reference, x, y)
    assert [record.step for record in records] == [0, 2, 4, 6, 8]
    for record in records:
        np.testing.assert_allclose(
            record.scalars["grad_norm/hidden"], references[record.step]["grad_norm/hidden"], rtol=1e-5
        )
    for probed_weight, reference_weight in zip(probed.weights, reference.weights):
        np.testing.assert_allclose(probed_weight.numpy(), reference_weight.numpy(), rtol=1e-6, atol=1e-7)


class DeterministicGAN(keras.Model):
    """Keras' guide GAN, with its noise taken from the data so that a reference can replay it."""

    def __init__(self):
        super().__init__(name="gan")
        self.discriminator, self.generator = gan_models()

    def compile(self, **kwargs):
        super().compile(**kwargs)
        self.d_optimizer = keras.optimizers.SGD(0.1)
        self.g_optimizer = keras.optimizers.SGD(0.2)
        self.loss_fn = keras.losses.BinaryCrossentropy()

    def losses_of(self, real, noise, d_tape_fn, g_tape_fn):
        """The two halves of the step; each ``*_tape_fn()`` opens that half's tape."""
        fake = self.generator(noise)
        images = tf.concat([fake, real], axis=0)
        labels = tf.concat([tf.ones((BATCH, 1)), tf.zeros((BATCH, 1))], axis=0)
        with d_tape_fn() as d_tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        d_grads = d_tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(d_grads, self.discriminator.trainable_weights))
        with g_tape_fn() as g_tape:
            g_loss = self.loss_fn(tf.zeros((BATCH, 1)), self.discriminator(self.generator(noise)))
        g_grads = g_tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(g_grads, self.generator.trainable_weights))
        return d_loss, g_loss

    def train_step(self, data):
        real, noise = data[0]  # fit((real, noise)) passes x = (real, noise)
        d_loss, g_loss = self.losses_of(
            real, noise,
            lambda: kgrad.ProbeTape(self.discriminator),
            lambda: kgrad.ProbeTape(self.generator),
        )
        return {"d_loss": d_loss, "g_loss": g_loss}


def _gan(mode):
    keras.utils.set_random_seed(2)
    gan = DeterministicGAN()
    gan.compile(**MODES[mode])
    return gan


def _gan_data(steps=4):
    rng = np.random.default_rng(3)
    real = rng.normal(size=(BATCH * steps, 2)).astype("float32")
    noise = rng.normal(size=(BATCH * steps, 3)).astype("float32")
    return real, noise


@pytest.mark.parametrize("mode", ["graph", "xla"])
def test_gan_logs_each_tape_as_a_run_at_its_optimizers_iterations(mode, tmp_path):
    real, noise = _gan_data()
    probed, plain = _gan(mode), _gan(mode)
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=2, statistics="all")
    probed.fit((real, noise), batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
    plain.fit((real, noise), batch_size=BATCH, shuffle=False, verbose=0)
    for probed_weight, plain_weight in zip(probed.weights, plain.weights):
        np.testing.assert_allclose(probed_weight.numpy(), plain_weight.numpy(), rtol=1e-6, atol=1e-7)

    logs = kgrad.read_logs(tmp_path)
    assert sorted(logs) == ["discriminator/kgrad", "generator/kgrad"]
    d_scalars, g_scalars = logs["discriminator/kgrad"]["scalars"], logs["generator/kgrad"]["scalars"]
    layers = {run: {tag for tag in scalars if tag.startswith("grad_norm/")} for run, scalars in (
        ("d", d_scalars), ("g", g_scalars))}
    assert layers == {
        "d": {"grad_norm/d_hidden", "grad_norm/d_out"}, "g": {"grad_norm/g_hidden", "grad_norm/g_out"}
    }
    assert "update_ratio/d_hidden/kernel" in d_scalars and "update_ratio/g_out/bias" in g_scalars

    # Reference: the same step with plain tapes on the hand-split GAN.
    reference = _gan(mode)
    expected = {"discriminator": [], "generator": []}
    for start in range(0, len(real), BATCH):
        reference.losses_of(
            tf.constant(real[start : start + BATCH]), tf.constant(noise[start : start + BATCH]),
            tf.GradientTape, tf.GradientTape,
        )
        expected["discriminator"].append(reference.d_optimizer.iterations.numpy() - 1)
        expected["generator"].append(reference.g_optimizer.iterations.numpy() - 1)
    assert d_scalars["grad_norm/d_hidden"].steps.tolist() == expected["discriminator"][::2] == [0, 2]
    assert g_scalars["grad_norm/g_hidden"].steps.tolist() == expected["generator"][::2]


def test_gan_values_equal_a_manual_tape_on_the_split_model():
    real, noise = _gan_data(steps=1)
    probed, reference = _gan("graph"), _gan("graph")
    probe = kgrad.GradientProbe(None, every_n_steps=1)
    probed.fit((real, noise), batch_size=BATCH, verbose=0, callbacks=[probe])
    records = probe.latest_by_tape

    real, noise = tf.constant(real), tf.constant(noise)
    fake = reference.generator(noise)
    images = tf.concat([fake, real], axis=0)
    labels = tf.concat([tf.ones((BATCH, 1)), tf.zeros((BATCH, 1))], axis=0)
    d = reference.discriminator
    with tf.GradientTape(persistent=True) as tape:
        hidden = d.get_layer("d_hidden")(images)
        probabilities = d.get_layer("d_out")(hidden)
        d_loss = reference.loss_fn(labels, probabilities)
    p = probabilities.numpy()
    # Keras' BCE on probabilities: dJ/dp = (p - y) / (p (1 - p)) / N.
    expected_out = (p - labels.numpy()) / (p * (1 - p)) / (2 * BATCH)
    d_record = records["discriminator"]
    np.testing.assert_allclose(
        d_record.scalars["grad_norm/d_hidden"], np.linalg.norm(tape.gradient(d_loss, hidden)), rtol=1e-5
    )
    np.testing.assert_allclose(d_record.scalars["grad_norm/d_out"], np.linalg.norm(expected_out), rtol=1e-5)
    kernel_gradient = tape.gradient(d_loss, d.get_layer("d_hidden").kernel)
    np.testing.assert_allclose(
        d_record.scalars["weight_grad_norm/d_hidden/kernel"], np.linalg.norm(kernel_gradient), rtol=1e-5
    )
    assert records["generator"].step == 0 and records["generator"].tape == "generator"


class DeterministicVAE(keras.Model):
    """Keras' VAE example with its ε from the data: the step calls only its sub-models."""

    def __init__(self):
        super().__init__(name="vae")
        inputs = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(5, activation="relu", name="enc_hidden")(inputs)
        z_mean = keras.layers.Dense(2, name="z_mean")(hidden)
        z_log_var = keras.layers.Dense(2, name="z_log_var")(hidden)
        self.encoder = keras.Model(inputs, [z_mean, z_log_var], name="encoder")
        latent = keras.Input((2,))
        self.decoder = keras.Sequential(
            [latent, keras.layers.Dense(FEATURES, name="dec_out")], name="decoder"
        )

    def loss_of(self, x, epsilon):
        z_mean, z_log_var = self.encoder(x)
        reconstruction = self.decoder(z_mean + tf.exp(0.5 * z_log_var) * epsilon)
        kl = -0.5 * tf.reduce_sum(1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var), axis=1)
        return tf.reduce_mean(tf.reduce_sum(tf.square(x - reconstruction), axis=1)) + tf.reduce_mean(kl)

    def train_step(self, data):
        x, epsilon = data[0]
        with kgrad.ProbeTape(self) as tape:
            loss = self.loss_of(x, epsilon)
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        return {"loss": loss}


def test_vae_step_that_never_calls_the_model_is_probed_through_its_sub_models(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(BATCH * 2, FEATURES)).astype("float32")
    epsilon = rng.normal(size=(BATCH * 2, 2)).astype("float32")
    keras.utils.set_random_seed(5)
    vae = DeterministicVAE()
    vae.compile(keras.optimizers.SGD(0.1), jit_compile=False)
    keras.utils.set_random_seed(5)
    reference = DeterministicVAE()
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1)
    vae.fit((x, epsilon), batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])

    scalars = kgrad.read_logs(tmp_path)["vae/kgrad"]["scalars"]
    assert {tag for tag in scalars if tag.startswith("grad_norm/")} == {
        "grad_norm/enc_hidden", "grad_norm/z_mean", "grad_norm/z_log_var", "grad_norm/dec_out",
    }
    with tf.GradientTape() as tape:
        loss = reference.loss_of(tf.constant(x[:BATCH]), tf.constant(epsilon[:BATCH]))
    kernel = reference.decoder.get_layer("dec_out").kernel
    np.testing.assert_allclose(
        scalars["weight_grad_norm/decoder/dec_out/kernel"].values[0],
        np.linalg.norm(tape.gradient(loss, kernel)), rtol=1e-5,
    )


def test_a_loss_outside_the_tape_gives_none_and_a_warning_not_zeros():
    x, y = _data(samples=BATCH)
    model = _classifier("graph")
    with kgrad.ProbeTape(model, persistent=True) as tape:
        probabilities = model(x)
    loss = model.loss_fn(y, probabilities)  # outside the block: the tape cannot see it
    with pytest.warns(UserWarning, match=r"dJ/d\(output of 'scores'\) is unknown.*prediction_gradient"):
        tape.gradient(loss, model.trainable_variables)
    assert tape.probe.gradients["scores"] is None
    assert tape.probe.gradients["hidden"] is not None


@pytest.mark.parametrize(
    "loss", ["categorical_crossentropy", keras.losses.categorical_crossentropy,
             keras.losses.CategoricalCrossentropy(), "model"],
)
def test_prediction_gradient_takes_every_loss_form_compile_takes(loss):
    x, y = _data(samples=BATCH)
    model = _classifier("graph")
    model.compile(loss="categorical_crossentropy")
    p = model(x)
    gradient = kgrad.prediction_gradient(model if loss == "model" else loss, y, p)
    np.testing.assert_allclose(gradient.numpy(), (1.0 - y / p.numpy()) / BATCH, rtol=1e-5)


def test_prediction_gradient_names_an_unknown_loss():
    with pytest.raises(ValueError, match=r"`loss_fn` names no Keras loss. Received: loss_fn='msee'"):
        kgrad.prediction_gradient("msee", tf.ones((1, 1)), tf.ones((1, 1)))


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_own_train_step_reads_the_device_only_after_executions_with_a_probed_step(
    device_reads, steps_per_execution  # noqa: F811 (the fixture imported above)
):
    x, y = _data(samples=STEPS_PER_EPOCH * 2)
    model = _classifier("graph", steps_per_execution=steps_per_execution)
    records = []
    probe = kgrad.GradientProbe(None, every_n_steps=EVERY_N_STEPS, on_probe=records.append)
    model.fit(
        x, y, batch_size=2, epochs=EPOCHS, shuffle=False, verbose=0,
        callbacks=[_EventLog(device_reads), probe],
    )
    assert _read_points(device_reads) == _expected_read_points(steps_per_execution)
    assert [record.step for record in records] == list(range(0, EPOCHS * STEPS_PER_EPOCH, EVERY_N_STEPS))
