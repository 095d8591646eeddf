"""Mixed precision on JAX: ``mixed_bfloat16`` (no loss scaling) against ``jax.grad`` of the same Keras
model's own stateless call; ``mixed_float16`` with a LossScaleOptimizer, and a ``loss_scale_factor``:
statistics of the true (unscaled) loss, steps the scaler skips marked as on TensorFlow."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad


@pytest.fixture
def bfloat16_policy():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def test_mixed_bfloat16_values_equal_jax_grad_of_the_model(bfloat16_policy, tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dense(1, name="out", dtype="float32")], name="m")
    model.compile(keras.optimizers.SGD(0.1), "mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 6)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")
    # Copies: fit donates the variables' buffers.
    trainable = [jnp.asarray(np.array(v.value)) for v in model.trainable_variables]
    non_trainable = [jnp.asarray(np.array(v.value)) for v in model.non_trainable_variables]

    def loss(trainable):
        prediction, _ = model.stateless_call(trainable, non_trainable, x, training=True)
        return jnp.mean(jnp.square(prediction.astype(jnp.float32) - y))

    expected = jax.grad(loss)(trainable)
    records = []
    model.fit(x, y, batch_size=16, verbose=0,
              callbacks=[kgrad.GradientProbe(str(tmp_path), on_probe=records.append)])
    (record,) = records
    paths = [v.path.removeprefix("m/") for v in model.trainable_variables]
    for path, gradient in zip(paths, expected):
        tag = f"weight_grad_norm/{path}"
        if tag in record.scalars:
            assert record.scalars[tag] == pytest.approx(float(jnp.linalg.norm(gradient)), rel=1e-3), tag
    # dJ/d(hidden output), from the model split by hand in the policy's dtypes.
    kernel1, bias1, kernel2, bias2 = trainable

    def split_loss(d_hidden):
        bf16 = jnp.bfloat16
        hidden = jax.nn.relu(x.astype(bf16) @ kernel1.astype(bf16) + bias1.astype(bf16))
        out = (hidden + d_hidden).astype(jnp.float32) @ kernel2 + bias2
        return jnp.mean(jnp.square(out - y))

    hidden_gradient = jax.grad(split_loss)(jnp.zeros((16, 8), jnp.bfloat16))
    expected_norm = float(jnp.linalg.norm(hidden_gradient.astype(jnp.float32)))
    assert record.scalars["grad_norm/hidden"] == pytest.approx(expected_norm, rel=1e-2)
    assert np.isfinite(list(record.scalars.values())).all()
    assert 0.0 <= record.scalars["activation_zero_fraction/hidden"] <= 1.0


# -- mixed_float16 and loss scaling: statistics of the true loss ---------------------------------

FEATURES, BATCH = 4, 4


@pytest.fixture
def float16_policy():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def _float16_data(samples):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, FEATURES)).astype("float32")
    return x, rng.normal(size=(samples, 2)).astype("float32")


def _tanh_model(optimizer, jit_compile=True):
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    outputs = keras.layers.Dense(2, name="out")(hidden)
    model = keras.Model(inputs, outputs, name="m")
    model.compile(optimizer, "mse", jit_compile=jit_compile)
    return model


def _true_loss_norms(model, x, y):
    """Norms of the gradients of the unscaled loss, float32, from the model split by hand."""
    weights = [jnp.asarray(np.array(v.value), jnp.float32) for v in model.trainable_variables]

    def loss(weights, x, d_hidden, d_out):
        k1, b1, k2, b2 = weights
        hidden = jnp.tanh(x @ k1 + b1) + d_hidden
        out = hidden @ k2 + b2 + d_out
        return jnp.mean(jnp.square(out - y))

    x = jnp.asarray(x)
    zeros_hidden, zeros_out = jnp.zeros((len(x), 8)), jnp.zeros((len(x), 2))
    weights_grad, x_grad, hidden_grad, out_grad = jax.grad(loss, argnums=(0, 1, 2, 3))(
        weights, x, zeros_hidden, zeros_out
    )
    norm = lambda tensor: float(jnp.linalg.norm(tensor))  # noqa: E731
    expected = {
        "grad_norm/hidden": norm(hidden_grad),
        "grad_norm/out": norm(out_grad),
        "pred_grad_norm/output": norm(out_grad),
        "input_grad_norm/input": norm(x_grad),
        "global/grad_norm": norm(jnp.concatenate([jnp.ravel(g) for g in weights_grad])),
    }
    for variable, gradient in zip(model.trainable_variables, weights_grad):
        expected[f"weight_grad_norm/{variable.path.removeprefix('m/')}"] = norm(gradient)
    return expected


@pytest.mark.parametrize("jit_compile", [True, False], ids=["jit", "no_jit"])
def test_mixed_float16_statistics_are_of_the_unscaled_loss_in_float32(float16_policy, jit_compile):
    keras.utils.set_random_seed(0)
    x, y = _float16_data(BATCH)
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**12)
    model = _tanh_model(optimizer, jit_compile)
    assert model.get_layer("hidden").compute_dtype == "float16"
    expected = _true_loss_norms(model, x, y)
    records = []
    model.fit(x, y, batch_size=BATCH, verbose=0,
              callbacks=[kgrad.GradientProbe(every_n_steps=1, on_probe=records.append, statistics="all",
                                             histogram_buckets="linear")])
    (record,) = records
    assert record.scalars["global/loss_scale"] == 2.0**12
    assert record.scalars["global/loss_scale_skipped"] == 0.0
    for tag, value in expected.items():
        # A scaled gradient would be 4096 times too large; float16 rounding stays within 1e-2.
        assert record.scalars[tag] == pytest.approx(value, rel=1e-2), tag
    for tag, buckets in record.histograms.items():
        assert buckets.dtype == np.float32 and np.all(np.isfinite(buckets)), tag
    kernel = record.histograms["weight_grad_hist/hidden/kernel"]
    assert kernel[0, 0] == pytest.approx(record.scalars["weight_grad_min/hidden/kernel"])
    assert kernel[-1, 1] == pytest.approx(record.scalars["weight_grad_max/hidden/kernel"])
    assert kernel[:, 2].sum() == FEATURES * 8


def test_a_loss_scale_factor_is_divided_back_out():
    keras.utils.set_random_seed(0)
    x, y = _float16_data(BATCH)
    model = _tanh_model(keras.optimizers.SGD(0.01, loss_scale_factor=64.0))
    expected = _true_loss_norms(model, x, y)
    records = []
    model.fit(x, y, batch_size=BATCH, verbose=0,
              callbacks=[kgrad.GradientProbe(every_n_steps=1, on_probe=records.append, statistics="all")])
    (record,) = records
    assert record.scalars["global/loss_scale"] == 64.0
    assert "global/loss_scale_skipped" not in record.scalars  # a fixed factor never skips
    for tag, value in expected.items():
        assert record.scalars[tag] == pytest.approx(value, rel=1e-5), tag


def test_steps_the_loss_scaler_skips_are_marked_and_training_is_unchanged(float16_policy, tmp_path):
    x, y = _float16_data(16 * BATCH)

    def fit(callbacks):
        keras.utils.set_random_seed(0)
        # 2**24 overflows float16 gradients: the scaler skips steps and halves its scale.
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**24)
        model = _tanh_model(optimizer)
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=callbacks)
        return model

    records = []
    probed = fit([kgrad.GradientProbe(tmp_path, every_n_steps=1, on_probe=records.append, statistics="all")])
    plain = fit([])
    for probed_weight, plain_weight in zip(probed.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(probed_weight, plain_weight)

    skipped = [r for r in records if r.scalars["global/loss_scale_skipped"] == 1.0]
    applied = [r for r in records if r.scalars["global/loss_scale_skipped"] == 0.0]
    assert skipped and applied and len(records) == 16
    assert int(probed.optimizer.iterations.numpy()) == len(applied)
    for record, after in zip(records, records[1:]):
        if record.scalars["global/loss_scale_skipped"] == 1.0:
            assert after.scalars["global/loss_scale"] == record.scalars["global/loss_scale"] / 2
            assert after.step == record.step
    assert not np.isfinite(skipped[0].scalars["global/grad_norm"])
    logs = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    applied_steps = [record.step for record in applied]
    for tag in ("global/grad_norm", "grad_norm/hidden", "weight_grad_nonfinite/hidden/kernel"):
        assert logs[tag].steps.tolist() == applied_steps, tag
        assert np.all(np.isfinite(logs[tag].values)), tag


def test_the_guard_under_loss_scaling_checks_the_loss_and_when_strict_the_gradients(float16_policy):
    x, y = _float16_data(16 * BATCH)

    def fit(guard):
        keras.utils.set_random_seed(0)
        # 2**20 overflows float16 gradients: the scaler skips steps and halves its scale, as designed.
        scaler = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**20)
        model = _tanh_model(scaler)
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
