"""GradientProbe under the ``mixed_float16`` policy and Keras' LossScaleOptimizer.

The tape differentiates the *scaled* loss, in float16; what kgrad reports is
of the true loss, in float32. Steps on which the scaled gradients overflow
are skipped by the loss scaler on purpose: they are marked, not reported as
exploding gradients.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from kgrad.report.health import health_report

FEATURES = 4
BATCH = 4


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _data(samples):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, FEATURES)).astype("float32")
    y = rng.normal(size=(samples, 2)).astype("float32")
    return x, y


def _model():
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    outputs = keras.layers.Dense(2, name="out")(hidden)
    return keras.Model(inputs, outputs)


def _compile(model, initial_scale, jit_compile=False):
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=initial_scale)
    model.compile(optimizer, "mse", jit_compile=jit_compile)
    return model


def _float32_reference(model, x, y):
    """Norms of the true gradients, from a float32 copy of ``model`` and a plain tape."""
    with _policy("float32"):
        reference = _model()
    reference.set_weights(model.get_weights())
    hidden_layer, out_layer = reference.get_layer("hidden"), reference.get_layer("out")
    x = tf.constant(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        hidden = hidden_layer(x)
        tape.watch(hidden)
        prediction = out_layer(hidden)
        tape.watch(prediction)
        loss = tf.reduce_mean(tf.square(prediction - y))
    norm = lambda tensor: float(tf.norm(tensor))  # noqa: E731
    expected = {
        "activation_norm/hidden": norm(hidden),
        "grad_norm/hidden": norm(tape.gradient(loss, hidden)),
        "grad_norm/out": norm(tape.gradient(loss, prediction)),
        "pred_grad_norm/output": norm(tape.gradient(loss, prediction)),
        "input_grad_norm/input": norm(tape.gradient(loss, x)),
    }
    weight_gradients = tape.gradient(loss, reference.trainable_weights)
    for weight, gradient in zip(reference.trainable_weights, weight_gradients):
        expected[f"weight_grad_norm/{weight.path}"] = norm(gradient)
        expected[f"weight_norm/{weight.path}"] = norm(weight)
    expected["global/grad_norm"] = float(tf.linalg.global_norm(weight_gradients))
    return expected


class _policy:
    """Sets the global dtype policy for the block."""

    def __init__(self, name):
        self._name = name

    def __enter__(self):
        self._saved = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(self._name)

    def __exit__(self, *exc_info):
        keras.mixed_precision.set_global_policy(self._saved)


# Under XLA the statistics run after the compiled step, on the float16
# tensors it returns (`ProbingStep.summarize_after_step`).
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_reported_gradients_are_unscaled_float32_statistics(mixed_float16, jit_compile):
    x, y = _data(samples=BATCH)
    model = _compile(_model(), initial_scale=2.0**12, jit_compile=jit_compile)
    assert model.get_layer("hidden").compute_dtype == "float16"
    expected = _float32_reference(model, x, y)
    records = []
    probe = kgrad.GradientProbe(
        every_n_steps=1, on_probe=records.append, statistics="all", histogram_buckets="linear"
    )
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[probe])

    (record,) = records
    assert record.scalars["global/loss_scale"] == 2.0**12
    assert record.scalars["global/loss_scale_skipped"] == 0.0
    for tag, value in expected.items():
        # A scaled gradient would be 4096 times too large.
        assert record.scalars[tag] == pytest.approx(value, rel=1e-2), tag
    for tag, buckets in record.histograms.items():
        assert buckets.dtype == np.float32, tag
        assert np.all(np.isfinite(buckets)), tag
    # Histograms span the unscaled values too, and count every element.
    kernel = record.histograms["weight_grad_hist/hidden/kernel"]
    assert kernel[0, 0] == pytest.approx(record.scalars["weight_grad_min/hidden/kernel"])
    assert kernel[-1, 1] == pytest.approx(record.scalars["weight_grad_max/hidden/kernel"])
    assert kernel[:, 2].sum() == FEATURES * 8


def test_an_optimizers_loss_scale_factor_is_divided_back_out():
    # Keras optimizers take a fixed `loss_scale_factor` too (float32 here):
    # the tape sees 64 J, kgrad reports the gradients of J.
    x, y = _data(samples=BATCH)
    model = _model()
    model.compile(keras.optimizers.SGD(0.01, loss_scale_factor=64.0), "mse")
    expected = _float32_reference(model, x, y)
    records = []
    probe = kgrad.GradientProbe(every_n_steps=1, on_probe=records.append, statistics="all")
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[probe])
    (record,) = records
    for tag, value in expected.items():
        assert record.scalars[tag] == pytest.approx(value, rel=1e-5), tag


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_steps_skipped_by_the_loss_scaler_are_marked_not_exploding(mixed_float16, tmp_path, jit_compile):
    x, y = _data(samples=16 * BATCH)
    # 2**24 overflows float16 gradients: the loss scaler skips steps and
    # halves its scale until the gradients fit.
    model = _compile(_model(), initial_scale=2.0**24, jit_compile=jit_compile)
    records = []
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, on_probe=records.append, statistics="all")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[probe])

    skipped = [record for record in records if record.scalars["global/loss_scale_skipped"] == 1.0]
    applied = [record for record in records if record.scalars["global/loss_scale_skipped"] == 0.0]
    assert len(skipped) + len(applied) == len(records) == 16
    assert skipped and applied
    assert int(model.optimizer.iterations.numpy()) == len(applied)
    # Each skip halves the scale; a skipped step does not advance the step.
    for record, after in zip(records, records[1:]):
        if record.scalars["global/loss_scale_skipped"] == 1.0:
            assert after.scalars["global/loss_scale"] == record.scalars["global/loss_scale"] / 2
            assert after.step == record.step
    # `on_probe` gets the whole record, overflowed gradients included.
    assert not np.isfinite(skipped[0].scalars["global/grad_norm"])

    logs = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    marks = logs["global/loss_scale_skipped"]
    assert marks.values.tolist() == [r.scalars["global/loss_scale_skipped"] for r in records]
    assert logs["global/loss_scale"].values.tolist() == [r.scalars["global/loss_scale"] for r in records]
    # Gradient tags are written for the applied steps only, all finite.
    applied_steps = [record.step for record in applied]
    for tag in ("global/grad_norm", "grad_norm/hidden", "weight_grad_nonfinite/hidden/kernel"):
        assert logs[tag].steps.tolist() == applied_steps, tag
        assert np.all(np.isfinite(logs[tag].values)), tag
    assert not logs["weight_grad_nonfinite/hidden/kernel"].values.any()
    (run,) = health_report(kgrad.read_logs(tmp_path))
    for layer in run.layers:
        assert "nonfinite" not in layer.flags and "exploding" not in layer.flags, layer


def test_no_loss_scale_tags_without_a_loss_scale_optimizer():
    x, y = _data(samples=BATCH)
    model = _model()
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=False)
    probe = kgrad.GradientProbe(every_n_steps=1)
    model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[probe])
    assert not [tag for tag in probe.latest.scalars if "loss_scale" in tag]


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


@pytest.mark.parametrize("make_model", [_model, OwnStep], ids=["keras_step", "own_step"])
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
