"""Loss scaling in a model's own JAX ``train_step``: the statistics are of the true loss.

The guide's model (`guide_model.GuideModel` with ``scales_loss``) differentiates
``self.optimizer.scale_loss(loss)`` as Keras' own step does under mixed precision. References:
a float64 ``jax.grad`` of the model split by hand (a fixed ``loss_scale_factor``, float32),
the same fit without the factor (every instrument), a float32 ``jax.grad`` of the true loss
(``mixed_float16`` with a LossScaleOptimizer), and the un-probed fit (steps the scaler skips).
"""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad
from guide_model import GuideModel
from test_own_step_jax import (
    BATCH, FEATURES, HIDDEN, RATE, STEPS, _assert_records, _data, _guide_reference, jax_gan,
)


def _scaling_model(optimizer, scales_loss=True, jit_compile=True):
    policy = keras.config.dtype_policy()
    keras.backend.clear_session()  # resets the global policy too
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(1, name="out", dtype="float32")(hidden)
    model = GuideModel(inputs, outputs, name="guide")
    model.scales_loss = scales_loss
    model.compile(optimizer, "mse", metrics=["mae"], jit_compile=jit_compile)
    return model


@pytest.fixture
def float16_policy():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("jit_compile", [True, False], ids=["jit", "no_jit"])
def test_a_loss_scale_factor_is_divided_back_out_as_a_float64_jax_grad_says(jit_compile, tmp_path):
    x, y = _data()
    model = _scaling_model(keras.optimizers.SGD(RATE, loss_scale_factor=64.0), jit_compile=jit_compile)
    initial = [np.asarray(w) for w in model.get_weights()]
    records = []
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=1, statistics="all", on_probe=records.append,
                                histogram_buckets="linear")
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
    references = _guide_reference(initial, x, y)
    for reference in references:
        reference["global/loss_scale"] = 64.0
    _assert_records(records, references)
    # The histograms too: 64 times too wide if the scaled gradients were summarized.
    histogram = records[0].histograms["grad_hist/hidden"]
    assert histogram[0, 0] == pytest.approx(records[0].scalars["grad_min/hidden"])
    assert histogram[-1, 1] == pytest.approx(records[0].scalars["grad_max/hidden"])


def test_every_instrument_logs_what_the_unscaled_fit_logs(tmp_path):
    """64 is a power of two: scaling and unscaling are exact, so every value is the unscaled fit's."""
    x, y = _data()

    def fit(scale, log_dir):
        # Clipped over all it applies: the clip must see the unscaled gradients, as Adam does.
        optimizer = keras.optimizers.Adam(0.01, global_clipnorm=5.0, loss_scale_factor=scale)
        model = _scaling_model(optimizer, scales_loss=scale is not None)
        records = []
        probe = kgrad.GradientProbe(
            str(log_dir), every_n_steps=1, statistics="all", instruments=["per_example", "optimizer"],
            on_probe=records.append,
        )
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[probe])
        return model, records

    scaled_model, scaled = fit(64.0, tmp_path / "scaled")
    plain_model, plain = fit(None, tmp_path / "plain")
    for with_scale, without in zip(scaled_model.get_weights(), plain_model.get_weights(), strict=True):
        np.testing.assert_array_equal(with_scale, without)
    assert len(scaled) == len(plain) == 2 * STEPS
    assert any(tag.startswith("example_grad_norm_") for tag in plain[0].scalars)
    assert any(tag.startswith("grad_outlier_fraction/") for tag in plain[0].scalars)
    for with_scale, without in zip(scaled, plain):
        assert with_scale.scalars.pop("global/loss_scale") == 64.0
        assert set(with_scale.scalars) == set(without.scalars)
        for tag, value in without.scalars.items():
            assert with_scale.scalars[tag] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), tag
        for tag, histogram in without.histograms.items():
            np.testing.assert_allclose(with_scale.histograms[tag], histogram, rtol=1e-6, err_msg=tag)


class ScaledGAN(jax_gan.GAN):
    """examples/jax_gan.py's GAN, each part's loss scaled by its own optimizer's fixed factor."""

    def compute_d_loss(self, *args):
        loss, aux = super().compute_d_loss(*args)
        return self.d_optimizer.scale_loss(loss), aux

    def compute_g_loss(self, *args):
        loss, aux = super().compute_g_loss(*args)
        return self.g_optimizer.scale_loss(loss), aux


def test_each_gan_part_is_unscaled_by_its_own_optimizers_factor(tmp_path):
    """Two parts, two factors (4 and 256): every value is the unscaled GAN's, guarded and probed."""

    def fit(scales, log_dir):
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        made = jax_gan.make_gan()  # its sub-models, with the seed's weights
        gan = (jax_gan.GAN if scales is None else ScaledGAN)(made.discriminator, made.generator)
        d_scale, g_scale = scales or (None, None)
        gan.compile(keras.optimizers.Adam(0.01, loss_scale_factor=d_scale),
                    keras.optimizers.Adam(0.01, loss_scale_factor=g_scale), keras.losses.BinaryCrossentropy())
        records, guard = [], kgrad.NonFiniteGuard()
        probe = kgrad.GradientProbe(
            str(log_dir), every_n_steps=1, statistics="all", instruments=["per_example", "optimizer"],
            on_probe=records.append,
        )
        gan.fit(jax_gan.ring(64), batch_size=16, shuffle=False, verbose=0, callbacks=[probe, guard])
        assert guard.report is None
        return gan, sorted(records, key=lambda record: (record.step, record.tape))

    scaled_gan, scaled = fit((4.0, 256.0), tmp_path / "scaled")
    plain_gan, plain = fit(None, tmp_path / "plain")
    for with_scale, without in zip(scaled_gan.get_weights(), plain_gan.get_weights(), strict=True):
        np.testing.assert_array_equal(with_scale, without)
    assert [(r.tape, r.step) for r in scaled] == [(r.tape, r.step) for r in plain] and len(plain) == 8
    for with_scale, without in zip(scaled, plain):
        expected_scale = {"discriminator": 4.0, "generator": 256.0}[without.tape]
        assert with_scale.scalars.pop("global/loss_scale") == expected_scale
        assert set(with_scale.scalars) == set(without.scalars)
        # Two programs, summed in different orders: a mean of mixed signs (|mean| ~1e-4 of values
        # ~1e-2) differs by ~1e-9; a factor left in would be 4 or 256 times off.
        for tag, value in without.scalars.items():
            assert with_scale.scalars[tag] == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), tag
        for tag, histogram in without.histograms.items():
            np.testing.assert_allclose(with_scale.histograms[tag], histogram, rtol=1e-5, err_msg=tag)


def _true_loss_gradients(weights, x, y):
    """Float32 gradients of the unscaled loss of the guide's model split by hand: (weights, hidden, out)."""
    weights = [jnp.asarray(w, jnp.float32) for w in weights]

    def loss(weights, d_hidden, d_out):
        kernel1, bias1, kernel2, bias2 = weights
        hidden = jax.nn.relu(x @ kernel1 + bias1) + d_hidden
        out = hidden @ kernel2 + bias2 + d_out
        return jnp.mean(jnp.square(out - y))

    return jax.grad(loss, (0, 1, 2))(weights, jnp.zeros((len(x), HIDDEN)), jnp.zeros((len(x), 1)))


@pytest.mark.parametrize("jit_compile", [True, False], ids=["jit", "no_jit"])
def test_mixed_float16_with_a_loss_scale_optimizer_logs_the_true_loss(float16_policy, jit_compile, tmp_path):
    x, y = _data(BATCH)
    scaler = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(RATE), initial_scale=2.0**12)
    model = _scaling_model(scaler, jit_compile=jit_compile)
    assert model.get_layer("hidden").compute_dtype == "float16"
    weight_gradients, hidden, out = _true_loss_gradients([np.asarray(w) for w in model.get_weights()], x, y)
    records = []
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=1, statistics="all", on_probe=records.append,
                                histogram_buckets="linear")
    model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[probe])
    (record,) = records
    assert record.scalars["global/loss_scale"] == 2.0**12
    assert record.scalars["global/loss_scale_skipped"] == 0.0
    expected = {
        "grad_norm/hidden": hidden, "grad_norm/out": out, "pred_grad_norm/output": out,
        "weight_grad_norm/hidden/kernel": weight_gradients[0],
        "weight_grad_norm/out/kernel": weight_gradients[2],
        "global/grad_norm": jnp.concatenate([jnp.ravel(g) for g in weight_gradients]),
    }
    for tag, gradient in expected.items():
        # A scaled gradient would be 4096 times too large; float16 rounding stays within 1e-2.
        assert record.scalars[tag] == pytest.approx(float(jnp.linalg.norm(gradient)), rel=1e-2), tag
    kernel = record.histograms["weight_grad_hist/hidden/kernel"]
    assert kernel[0, 0] == pytest.approx(record.scalars["weight_grad_min/hidden/kernel"])
    assert kernel[-1, 1] == pytest.approx(record.scalars["weight_grad_max/hidden/kernel"])


def _fit_overflowing(initial_scale, callbacks):
    """16 steps of mixed_float16 under a LossScaleOptimizer whose scale overflows float16 gradients.

    The scaler skips those steps and halves its scale until the gradients fit, as designed.
    """
    x, y = _data(16 * BATCH)
    scaler = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(RATE), initial_scale=initial_scale)
    model = _scaling_model(scaler)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=callbacks)
    return model


def test_steps_the_loss_scaler_skips_are_marked_and_training_is_unchanged(float16_policy, tmp_path):
    records = []
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=1, on_probe=records.append)
    probed, plain = _fit_overflowing(2.0**24, [probe]), _fit_overflowing(2.0**24, [])
    for probed_weight, plain_weight in zip(probed.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(probed_weight, plain_weight)
    skipped = [r for r in records if r.scalars["global/loss_scale_skipped"] == 1.0]
    applied = [r for r in records if r.scalars["global/loss_scale_skipped"] == 0.0]
    assert skipped and applied and len(records) == 16
    for record, after in zip(records, records[1:]):
        if record.scalars["global/loss_scale_skipped"] == 1.0:
            assert after.scalars["global/loss_scale"] == record.scalars["global/loss_scale"] / 2
            assert after.step == record.step  # a skipped step did not advance the iterations
    # Only the applied steps reach the event file, as with Keras' own step.
    logs = kgrad.read_logs(str(tmp_path))["guide/kgrad"]["scalars"]
    assert logs["global/grad_norm"].steps.tolist() == [record.step for record in applied]
    assert np.all(np.isfinite(logs["global/grad_norm"].values))


def test_a_function_returning_another_value_than_the_scaled_loss_is_refused(tmp_path):
    class Rescaled(GuideModel):
        def compute_loss_and_updates(self, *args, **kwargs):
            scaled, aux = super().compute_loss_and_updates(*args, **kwargs)
            return scaled * 1.0, aux

    def fit(callback):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((FEATURES,))
        model = Rescaled(inputs, keras.layers.Dense(1, name="out")(inputs), name="guide")
        model.scales_loss = True
        model.compile(keras.optimizers.SGD(RATE, loss_scale_factor=8.0), "mse")
        refused = r"'guide'.*called `scale_loss` of SGD but returned another value.*Return the scaled loss"
        with pytest.raises(ValueError, match=refused):
            model.fit(*_data(), batch_size=BATCH, verbose=0, callbacks=[callback])

    fit(kgrad.GradientProbe(str(tmp_path / "logs")))
    assert not (tmp_path / "logs").exists()  # refused before anything was written
    fit(kgrad.NonFiniteGuard())


# -- kgrad.NonFiniteGuard ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_overflowing_weights():
    """The weights after ``_fit_overflowing(2.0**20, [])``: the plain fit both guard tests compare with."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        return _fit_overflowing(2.0**20, []).get_weights()
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("probed", [False, True], ids=["guard", "guard_and_probe"])
def test_the_guard_checks_the_loss_and_when_strict_the_gradients(
    plain_overflowing_weights, float16_policy, probed, tmp_path
):
    def fit(callbacks):
        return _fit_overflowing(2.0**20, callbacks)

    probe = [kgrad.GradientProbe(str(tmp_path), every_n_steps=2, overwrite=True)] if probed else []
    guard = kgrad.NonFiniteGuard()
    model = fit([guard, *probe])
    assert guard.report is None
    assert 0 < int(model.optimizer.iterations.numpy()) < 16  # some steps skipped by the scaler
    for guarded_weight, plain_weight in zip(model.get_weights(), plain_overflowing_weights, strict=True):
        np.testing.assert_array_equal(guarded_weight, plain_weight)
    strict = kgrad.NonFiniteGuard(ignore_loss_scale_skips=False)
    fit([strict, *probe])
    assert strict.report is not None and strict.report.pass_ == "backward"
    assert strict.report.tensor.startswith("weight_grad/guide/") and strict.report.step == 0
    # The replay differentiates the true loss, whose gradients are finite: it says why.
    assert not strict.report.replayed and "the loss scaler's signal" in strict.report.replay_note


@pytest.mark.parametrize("watch", ["default", "all"])
def test_the_guards_report_is_the_unscaled_fits(watch, tmp_path):
    """A fixed ``loss_scale_factor``: the report's norms and the replay are those of the unscaled fit."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.0, size=(4 * BATCH, FEATURES)).astype("float32")
    y = rng.normal(size=(4 * BATCH, 1)).astype("float32")
    x[2 * BATCH : 3 * BATCH] = 0.0  # sqrt(0) = 0 is finite; its gradient is not: the kernel's is NaN/Inf

    def report(scale):
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        inputs = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(3, use_bias=False, kernel_initializer="ones", name="hidden")(inputs)
        outputs = keras.layers.Dense(1, name="out")(keras.layers.Lambda(keras.ops.sqrt, name="root")(hidden))
        model = GuideModel(inputs, outputs, name="guide")
        model.scales_loss = scale is not None
        model.compile(keras.optimizers.SGD(0.01, loss_scale_factor=scale), "mse")
        guard = kgrad.NonFiniteGuard(**({} if watch == "default" else {"watch": watch}))
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
        return guard.report

    scaled, unscaled = report(1024.0), report(None)
    assert (unscaled.step, unscaled.last_finite_step) == (2, 1)
    assert unscaled.last_finite_norm > 0 and unscaled.replayed
    first = "weight_grad/guide/hidden/kernel" if watch == "default" else "grad/guide/hidden"
    assert unscaled.tensor == first
    for field in ("step", "last_finite_step", "tensor", "pass_", "non_finite", "born_in", "born_at"):
        assert getattr(scaled, field) == getattr(unscaled, field), field
    assert scaled.last_finite_norm == pytest.approx(unscaled.last_finite_norm, rel=1e-5)
