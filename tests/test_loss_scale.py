"""Loss scaling on both backends: what kgrad reports is of the true loss, in float32.

Under ``mixed_float16`` with Keras' LossScaleOptimizer (or an optimizer's fixed
``loss_scale_factor``) the gradients Keras computes are of the *scaled* loss;
kgrad divides the scale back out. Steps the loss scaler skips on purpose (its
float16 gradients overflowed) are marked, not reported as exploding gradients,
and the NonFiniteGuard lets them pass unless told otherwise.

Backend-free (Keras and NumPy): the TensorFlow run collects this module and
``tests/jax/test_loss_scale_jax.py`` imports its tests into the JAX run. The
reference is the two-layer model's gradients written out by hand in float64
NumPy. Each backend compiles as Keras does by default on a CPU (graph on
TensorFlow, XLA on JAX), and the first test runs both ways on both.
"""

import keras
import numpy as np
import pytest

import kgrad
from kgrad.report.health import health_report

FEATURES, HIDDEN, OUTPUTS, BATCH = 4, 8, 2, 4


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def regression_data(samples):
    """``samples`` rows of normal features and of 2 normal targets, float32."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, FEATURES)).astype("float32")
    return x, rng.normal(size=(samples, OUTPUTS)).astype("float32")


def _model(optimizer, jit_compile="auto"):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(HIDDEN, activation="tanh", name="hidden")(inputs)
    outputs = keras.layers.Dense(OUTPUTS, name="out")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer, "mse", jit_compile=jit_compile)
    return model


def _true_loss_statistics(model, x, y):
    """Norms of the unscaled loss's gradients (and of the activation and weights), float64 NumPy.

    ``hidden = tanh(x K1 + b1)``, ``out = hidden K2 + b2``, ``loss = mean((out - y)**2)``,
    differentiated by hand.
    """
    k1, b1, k2, b2 = (np.asarray(w, np.float64) for w in model.get_weights())
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    hidden = np.tanh(x @ k1 + b1)
    out = hidden @ k2 + b2
    d_out = 2 * (out - y) / out.size
    d_pre = (d_out @ k2.T) * (1 - hidden**2)
    weight_gradients = {"hidden/kernel": x.T @ d_pre, "hidden/bias": d_pre.sum(0),
                        "out/kernel": hidden.T @ d_out, "out/bias": d_out.sum(0)}
    norm = np.linalg.norm
    expected = {
        "activation_norm/hidden": norm(hidden),
        "grad_norm/hidden": norm(d_out @ k2.T),
        "grad_norm/out": norm(d_out),
        "pred_grad_norm/output": norm(d_out),
        "input_grad_norm/input": norm(d_pre @ k1.T),
        "global/grad_norm": np.sqrt(sum(np.sum(g**2) for g in weight_gradients.values())),
    }
    for (path, gradient), weight in zip(weight_gradients.items(), (k1, b1, k2, b2)):
        expected[f"weight_grad_norm/{path}"] = norm(gradient)
        expected[f"weight_norm/{path}"] = norm(weight)
    return expected


# With XLA the statistics run after the compiled step on TensorFlow, on the float16 tensors
# it returns (`ProbingStep.summarize_after_step`); JAX compiles them into the step.
@pytest.mark.parametrize("jit_compile", [False, True], ids=["no_jit", "jit"])
def test_reported_gradients_are_unscaled_float32_statistics(mixed_float16, jit_compile):
    x, y = regression_data(BATCH)
    model = _model(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**12),
                   jit_compile)
    assert model.get_layer("hidden").compute_dtype == "float16"
    expected = _true_loss_statistics(model, x, y)
    records = []
    probe = kgrad.GradientProbe(
        every_n_steps=1, on_probe=records.append, statistics="all", histogram_buckets="linear"
    )
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[probe])

    (record,) = records
    assert record.scalars["global/loss_scale"] == 2.0**12
    assert record.scalars["global/loss_scale_skipped"] == 0.0
    for tag, value in expected.items():
        # A scaled gradient would be 4096 times too large; float16 rounding stays within 1e-2.
        assert record.scalars[tag] == pytest.approx(value, rel=1e-2), tag
    for tag, buckets in record.histograms.items():
        assert buckets.dtype == np.float32 and np.all(np.isfinite(buckets)), tag
    # Histograms span the unscaled values too, and count every element.
    kernel = record.histograms["weight_grad_hist/hidden/kernel"]
    assert kernel[0, 0] == pytest.approx(record.scalars["weight_grad_min/hidden/kernel"])
    assert kernel[-1, 1] == pytest.approx(record.scalars["weight_grad_max/hidden/kernel"])
    assert kernel[:, 2].sum() == FEATURES * HIDDEN


def test_an_optimizers_loss_scale_factor_is_divided_back_out():
    # Keras optimizers take a fixed `loss_scale_factor` too (float32 here):
    # Keras differentiates 64 J, kgrad reports the gradients of J.
    x, y = regression_data(BATCH)
    model = _model(keras.optimizers.SGD(0.01, loss_scale_factor=64.0))
    expected = _true_loss_statistics(model, x, y)
    records = []
    probe = kgrad.GradientProbe(every_n_steps=1, on_probe=records.append, statistics="all")
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[probe])
    (record,) = records
    assert "global/loss_scale_skipped" not in record.scalars  # a fixed factor never skips
    if keras.config.backend() == "jax":
        # JAX logs the fixed factor as the loss scale; TensorFlow writes no loss-scale tag
        # for it (the backends differ here; both report the true gradients).
        assert record.scalars["global/loss_scale"] == 64.0
    for tag, value in expected.items():
        assert record.scalars[tag] == pytest.approx(value, rel=1e-5), tag


def test_steps_skipped_by_the_loss_scaler_are_marked_not_exploding_and_training_is_unchanged(
    mixed_float16, tmp_path
):
    x, y = regression_data(16 * BATCH)

    def fit(callbacks):
        # 2**24 overflows float16 gradients: the loss scaler skips steps and
        # halves its scale until the gradients fit.
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**24)
        model = _model(optimizer)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        return model

    records = []
    model = fit([kgrad.GradientProbe(tmp_path, every_n_steps=1, on_probe=records.append, statistics="all")])
    for probed, plain in zip(model.get_weights(), fit([]).get_weights()):
        np.testing.assert_array_equal(probed, plain)

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
    x, y = regression_data(BATCH)
    model = _model(keras.optimizers.SGD(0.01))
    probe = kgrad.GradientProbe(every_n_steps=1)
    model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[probe])
    assert not [tag for tag in probe.latest.scalars if "loss_scale" in tag]


def test_the_guard_under_loss_scaling_checks_the_loss_and_when_strict_the_gradients(mixed_float16):
    x, y = regression_data(16 * BATCH)

    def fit(guard):
        # 2**20 overflows float16 gradients: the scaler skips steps and halves its scale, as designed.
        scaler = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**20)
        model = _model(scaler)
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
        return model

    guard = kgrad.NonFiniteGuard()
    model = fit(guard)
    assert guard.report is None
    assert 0 < int(model.optimizer.iterations.numpy()) < 16  # some steps skipped by the scaler
    strict = kgrad.NonFiniteGuard(ignore_loss_scale_skips=False)
    fit(strict)
    assert strict.report is not None and strict.report.pass_ == "backward"
    assert strict.report.tensor.startswith("weight_grad/") and strict.report.step == 0


def test_the_guards_last_finite_norm_is_of_the_unscaled_gradient():
    """A fixed ``loss_scale_factor`` scales the gradients Keras computes: the report gives the true ones."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.0, size=(4 * BATCH, FEATURES)).astype("float32")
    y = rng.normal(size=(4 * BATCH, 1)).astype("float32")
    x[2 * BATCH : 3 * BATCH] = 0.0  # sqrt(0) = 0 is finite; its gradient is not: the kernel's is NaN/Inf

    def report(optimizer):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(3, use_bias=False, kernel_initializer="ones", name="hidden")(inputs)
        outputs = keras.layers.Dense(1, name="out")(keras.layers.Lambda(keras.ops.sqrt, name="root")(hidden))
        model = keras.Model(inputs, outputs)
        model.compile(optimizer, "mse")
        guard = kgrad.NonFiniteGuard(replay=False)
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
        return guard.report

    scaled = report(keras.optimizers.SGD(0.01, loss_scale_factor=1024.0))
    unscaled = report(keras.optimizers.SGD(0.01))
    assert (scaled.step, scaled.last_finite_step, scaled.tensor) == (2, 1, "weight_grad/hidden/kernel")
    assert unscaled.last_finite_norm > 0
    assert scaled.last_finite_norm == pytest.approx(unscaled.last_finite_norm, rel=1e-5)
