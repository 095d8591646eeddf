"""`kgrad.GradientProbe` on Keras' JAX backend, against a float64 ``jax.grad`` of the model split by hand.

The model: x → Dense(relu) "hidden" → keras.ops.sin (an op node) → Dense "out",
mean squared error, plain SGD, so that the reference can follow the weights
step by step. Every logged value is compared, on every probed step, with
jit on and off; the weights after the probed fit are the plain fit's.

What holds on both backends (model kinds, the record's types, bad options, the schedule
across fits) is tested once, in tests/test_gradient_probe.py, run here too.
"""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad
from test_gradient_probe import (  # noqa: F401 (collected here, in the JAX run)
    test_a_later_probed_fit_starts_a_fresh_schedule,
    test_bad_layer_item_type_is_refused,
    test_bad_options_name_the_argument_and_the_value,
    test_every_n_steps_must_be_a_positive_int,
    test_latest_is_plain_python_and_numpy,
    test_probes_sequential_functional_and_subclassed_models,
    test_two_probes_in_one_fit_are_refused_and_the_model_restored,
    test_unknown_layer_name_fails_at_fit_start_and_leaves_the_model_untouched,
    test_unwritable_log_dir_is_refused,
)

BATCH, STEPS, FEATURES, HIDDEN, LEARNING_RATE = 8, 4, 3, 5, 0.1


def _model(jit_compile):
    keras.backend.clear_session()  # the sin node is named "sin" in every test
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(inputs)
    waved = keras.ops.sin(hidden)
    outputs = keras.layers.Dense(1, name="out")(waved)
    model = keras.Model(inputs, outputs, name="m")
    model.compile(keras.optimizers.SGD(LEARNING_RATE), "mse", jit_compile=jit_compile)
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(BATCH * STEPS, FEATURES)).astype("float32"), rng.normal(
        size=(BATCH * STEPS, 1)
    ).astype("float32")


def _norm(a):
    return float(np.sqrt(np.sum(np.square(np.asarray(a, np.float64)))))


def _reference(weights, x, y):
    """Per step, the values kgrad logs, from a float64 jax.grad of the hand-split model."""
    kernel1, bias1, kernel2, bias2 = (np.asarray(w, np.float64) for w in weights)
    records = []
    with jax.enable_x64(True):
        for step in range(STEPS):
            xb = jnp.asarray(x[step * BATCH : (step + 1) * BATCH], jnp.float64)
            yb = jnp.asarray(y[step * BATCH : (step + 1) * BATCH], jnp.float64)

            def loss(params, xb, d_hidden, d_sin, d_out, yb=yb):
                k1, b1, k2, b2 = params
                hidden = jax.nn.relu(xb @ k1 + b1) + d_hidden
                waved = jnp.sin(hidden) + d_sin
                out = waved @ k2 + b2 + d_out
                return jnp.mean(jnp.square(out - yb)), (hidden, waved)

            params = [jnp.asarray(w) for w in (kernel1, bias1, kernel2, bias2)]
            zeros = (jnp.zeros((BATCH, HIDDEN)), jnp.zeros((BATCH, HIDDEN)), jnp.zeros((BATCH, 1)))
            grads, (hidden, waved) = jax.grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)(params, xb, *zeros)
            loss_value = float(loss(params, xb, *zeros)[0])
            weight_grads, dx, d_hidden, d_sin, d_out = grads[0], grads[1], grads[2], grads[3], grads[4]
            paths = ["hidden/kernel", "hidden/bias", "out/kernel", "out/bias"]
            record = {
                "grad_norm/hidden": _norm(d_hidden),
                "grad_norm/sin": _norm(d_sin),
                "grad_norm/out": _norm(d_out),
                "pred_grad_norm/output": _norm(d_out),
                "input_grad_norm/input": _norm(dx),
                "activation_mean/hidden": float(np.mean(hidden)),
                "activation_std/sin": float(np.std(waved)),
                "activation_zero_fraction/hidden": float(np.mean(np.asarray(hidden) == 0)),
                "global/grad_norm": float(np.sqrt(sum(_norm(g) ** 2 for g in weight_grads))),
                "global/loss": loss_value,
            }
            new = [p - LEARNING_RATE * g for p, g in zip(params, weight_grads)]
            for path, p, g, n in zip(paths, params, weight_grads, new):
                record[f"weight_grad_norm/{path}"] = _norm(g)
                record[f"weight_grad_max/{path}"] = float(np.max(g))
                record[f"weight_norm/{path}"] = _norm(p)
                change = _norm(np.asarray(n) - np.asarray(p))
                record[f"update_ratio/{path}"] = change / _norm(p) if _norm(p) > 0 else float(change > 0)
            params = new
            kernel1, bias1, kernel2, bias2 = (np.asarray(p) for p in params)
            records.append(record)
    return records


@pytest.mark.parametrize("jit_compile", [True, False])
def test_every_logged_value_equals_a_float64_jax_grad_reference(jit_compile, tmp_path):
    x, y = _data()
    model = _model(jit_compile)
    initial = [np.asarray(w) for w in model.get_weights()]
    records = []
    # Linear histograms, whose edges are the min and max (tests/jax/test_log_histograms_jax.py: the log kind).
    probe = kgrad.GradientProbe(
        str(tmp_path), layers="all", every_n_steps=1, statistics="all", on_probe=records.append,
        histogram_buckets="linear",
    )
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
    assert [record.step for record in records] == list(range(STEPS))
    for record, expected in zip(records, _reference(initial, x, y)):
        for tag, value in expected.items():
            assert record.scalars[tag] == pytest.approx(value, rel=1e-4, abs=1e-6), (record.step, tag)
        histogram = record.histograms["grad_hist/hidden"]
        assert histogram.shape == (30, 3) and histogram[:, 2].sum() == BATCH * HIDDEN
        assert histogram[0, 0] == pytest.approx(record.scalars["grad_min/hidden"])
        assert histogram[-1, 1] == pytest.approx(record.scalars["grad_max/hidden"])
    assert probe.latest is records[-1]


@pytest.mark.parametrize("jit_compile", [True, False])
def test_a_probed_fit_trains_like_a_plain_fit(jit_compile, tmp_path):
    x, y = _data()
    probed, plain = _model(jit_compile), _model(jit_compile)
    probed.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[kgrad.GradientProbe(str(tmp_path), every_n_steps=3)],
    )
    plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    for probed_weight, plain_weight in zip(probed.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(probed_weight, plain_weight, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_the_probed_steps_and_their_records_with_several_steps_per_execution(steps_per_execution, tmp_path):
    x, y = _data()
    model = _model(True)
    model.compile(keras.optimizers.SGD(LEARNING_RATE), "mse", steps_per_execution=steps_per_execution)
    records = []
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=3,
        shuffle=False,
        verbose=0,
        callbacks=[kgrad.GradientProbe(str(tmp_path), every_n_steps=2, on_probe=records.append)],
    )
    # 4 steps an epoch, 12 in all; every second one probed, each record at its own step.
    assert [record.step for record in records] == [0, 2, 4, 6, 8, 10]
    logs = kgrad.read_logs(str(tmp_path))
    steps, _ = logs["kgrad"]["scalars"]["weight_grad_norm/hidden/kernel"]
    assert steps.tolist() == [0, 2, 4, 6, 8, 10]
    values = [record.scalars["weight_grad_norm/hidden/kernel"] for record in records]
    np.testing.assert_allclose(
        logs["kgrad"]["scalars"]["weight_grad_norm/hidden/kernel"].values, values, rtol=1e-6
    )


def test_default_statistics_write_the_tags_tensorflow_writes(tmp_path):
    x, y = _data()
    records = []
    _model(True).fit(
        x,
        y,
        batch_size=BATCH,
        shuffle=False,
        verbose=0,
        callbacks=[kgrad.GradientProbe(str(tmp_path), on_probe=records.append)],
    )
    # The default layers: the leaf layers with weights.
    assert set(records[0].scalars) == {
        "activation_zero_fraction/hidden",
        "activation_zero_fraction/out",
        "grad_norm/hidden",
        "grad_nonfinite/hidden",
        "grad_norm/out",
        "grad_nonfinite/out",
        "pred_grad_norm/output",
        "input_grad_norm/input",
        "weight_grad_norm/hidden/kernel",
        "weight_grad_norm/out/kernel",
        "weight_norm/hidden/kernel",
        "weight_norm/out/kernel",
        "update_ratio/hidden/kernel",
        "update_ratio/out/kernel",
        "global/grad_norm",
        "global/loss",
    }
    assert set(records[0].histograms) == {
        "grad_hist/hidden",
        "grad_hist/out",
        "pred_grad_hist/output",
        "input_grad_hist/input",
        "weight_grad_hist/hidden/kernel",
        "weight_grad_hist/out/kernel",
    }
