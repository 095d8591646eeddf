"""Mixed precision on JAX: ``mixed_bfloat16`` (no loss scaling) against ``jax.grad`` of the same Keras
model's own stateless call. ``mixed_float16`` and loss scaling (the probe's statistics, the steps the
scaler skips, the guard) are tested for both backends in tests/test_loss_scale.py, which
tests/jax/test_loss_scale_jax.py runs here, and the guard's replay whatever the loss scale in
tests/test_mixed_precision.py, whose backend-free test runs here too."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad
from test_mixed_precision import (  # noqa: F401 (collected here, in the JAX run)
    mixed_float16,
    test_the_guard_reports_norms_of_the_true_loss_whatever_the_loss_scale,
)


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
