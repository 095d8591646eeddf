"""`kgrad.NonFiniteGuard(watch=...)` on JAX: the cases of tests/test_non_finite_guard.py, the same reports.

The cases whose expectations are the same lines on both backends are in
tests/test_guard_watch.py (run here by test_guard_watch_shared_jax.py).

Inputs, activations, dJ/dŷ and dJ/d(activation) are checked every step inside
the jitted step (and run eagerly); the first non-finite tensor in forward,
then backward order is reported, and the bad update is kept out.
"""

import functools

import keras
import numpy as np
import pytest

import kgrad
from fit_helpers import guard_data, middle_model

BATCH = 4


def _tanh_model():
    return middle_model(lambda t: keras.ops.tanh(t))


def _fit(model, x, y, callbacks, jit_compile=True, steps_per_execution=1, loss="mse"):
    model.compile(keras.optimizers.SGD(0.01), loss, jit_compile=jit_compile,
                  steps_per_execution=steps_per_execution)
    model.fit(x, y, batch_size=BATCH, shuffle=False, callbacks=callbacks, verbose=0)
    return model


def _assert_weights_of_plain_fit(model, make_model, initial, x, y, jit_compile=True):
    plain = make_model()
    plain.set_weights(initial)
    _fit(plain, x, y, [], jit_compile=jit_compile)
    for got, want in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)


def _sqrt_at_zero_loss(y_true, y_pred):
    """MSE, plus sqrt(ŷ·0) on targets above 100: finite forward, NaN in dJ/dŷ there."""
    marked = keras.ops.cast(y_true > 100.0, "float32")
    return keras.ops.mean(keras.ops.square(y_true - y_pred) * (1.0 - marked)) + keras.ops.mean(
        keras.ops.sqrt(y_pred * 0.0 + (1.0 - marked))
    )


# Jitted only (CI's time); the cases run eagerly too are tests/test_guard_watch.py's, run on both backends.
ONLY_JIT = pytest.mark.parametrize("jit_compile", [True], ids=["jit"])


@ONLY_JIT
def test_nan_born_in_the_loss_gradient_is_reported_as_the_prediction_gradient(jit_compile):
    x, y = guard_data()
    y[8:12] = 1000.0  # batch 2 turns on the sqrt-at-zero term of the loss
    guard = kgrad.NonFiniteGuard(watch="all")
    _fit(_tanh_model(), x, y, [guard], jit_compile, loss=_sqrt_at_zero_loss)
    report = guard.report
    assert (report.step, report.pass_, report.kind, report.layer) == (2, "backward", "pred_grad", "output")
    assert report.nan_count == BATCH and report.last_finite_step == 1
    # On JAX dJ/dŷ is checked every step (a carrier in the one backward pass): its last norm is known.
    assert report.last_finite_norm > 0
    assert "grad/out" in report.non_finite and "weight_grad/out/kernel" in report.non_finite


@ONLY_JIT
def test_a_bad_batch_is_reported_as_the_input_and_its_update_skipped(jit_compile):
    x, y = guard_data()
    x[13, 1] = np.nan  # batch 3
    model = _tanh_model()
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(watch="all")
    _fit(model, x, y, [guard], jit_compile)
    report = guard.report
    assert (report.step, report.kind, report.layer, report.nan_count) == (3, "input", "input", 1)
    assert report.last_finite_step == 2
    _assert_weights_of_plain_fit(model, _tanh_model, initial, x[:12], y[:12], jit_compile)


def _masked_log_model():
    """`log` makes NaN for negative inputs; `mask` zeroes them before they reach anything."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, name="first"),
        keras.layers.Lambda(lambda t: keras.ops.log(t), name="log"),
        keras.layers.Lambda(lambda t: keras.ops.where(keras.ops.isnan(t), keras.ops.zeros_like(t), t),
                            name="mask"),
        keras.layers.Dense(1, name="out"),
    ])
    model.build((None, 3))
    kernel = np.concatenate([np.eye(3, 2), np.eye(3, 2)], axis=1).astype("float32")
    model.get_layer("first").set_weights([kernel, np.array([-1, -1, 1, 1], "float32")])
    return model


def test_watching_every_activation_trips_on_a_masked_nan_that_the_default_lets_through():
    x, y = guard_data()
    every_kind = kgrad.NonFiniteGuard(layers="all", watch="all")
    _fit(_masked_log_model(), x, y, [every_kind])
    report = every_kind.report
    assert (report.step, report.kind, report.layer) == (0, "activation", "log")
    model = _masked_log_model()
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(watch=["weight_gradients"], layers="all")
    _fit(model, x, y, [guard])
    assert guard.report is None
    _assert_weights_of_plain_fit(model, _masked_log_model, initial, x, y)


def test_steps_after_the_trip_in_an_execution_update_nothing():
    x, y = guard_data()
    x[21, 0] = np.inf  # batch 5, inside the second execution of 4 steps
    model = _tanh_model()
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(watch="all")
    _fit(model, x, y, [guard], steps_per_execution=4)
    assert (guard.report.step, guard.report.kind) == (5, "input")
    assert guard.report.last_finite_step == 4
    _assert_weights_of_plain_fit(model, _tanh_model, initial, x[:20], y[:20])


def test_a_clean_fit_watching_everything_trains_like_plain_fit():
    x, y = guard_data()
    model = _tanh_model()
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    _fit(model, x, y, [guard])
    assert guard.report is None
    _assert_weights_of_plain_fit(model, _tanh_model, initial, x, y)


def _report_fields(report):
    return (
        report.step, report.tensor, report.layer, report.kind, report.pass_, report.nan_count,
        report.inf_count, report.last_finite_step, report.non_finite, report.born_at,
    )


def _bad_log_model():
    model = middle_model(lambda t: keras.ops.log(t))
    model.build((None, 3))
    # `first` outputs x - 2 for these inputs above 1.5 only: a NaN from the 3rd batch on.
    model.get_layer("first").set_weights([np.eye(3, 4, dtype="float32"), -1.5 * np.ones(4, "float32")])
    return model


def _bad_prediction_gradient_model():
    return _tanh_model()


def _watch_case(case):
    """The data, loss and model of a case: a NaN born in an activation (forward) or in dJ/dŷ."""
    x, y = guard_data()
    if case == "forward_activation":
        x[2 * BATCH :] += 1.0  # from the 3rd batch on, `first` - 1.5 goes negative under log
        return x, y, "mse", _bad_log_model
    y[2 * BATCH + 1] = 500.0  # a NaN in dJ/dŷ at step 2 (`_sqrt_at_zero_loss`)
    return x, y, _sqrt_at_zero_loss, _bad_prediction_gradient_model


def _fit_watched(case, callbacks):
    """The report and weights of a fresh model of ``case`` fitted under a guard watching everything."""
    x, y, loss, make = _watch_case(case)
    model = make()
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    _fit(model, x, y, [guard, *callbacks], loss=loss)
    return guard.report, model.get_weights()


@pytest.fixture(scope="module")
def watched_alone():
    """``case`` -> `_fit_watched` without a probe: fitted once a case, for every `every_n_steps`."""
    return functools.cache(lambda case: _fit_watched(case, []))


@pytest.mark.parametrize("every_n_steps", [1, 2])
@pytest.mark.parametrize("case", ["forward_activation", "backward_prediction_gradient"])
def test_watch_with_a_gradient_probe_reports_what_it_reports_alone(
    watched_alone, case, every_n_steps, tmp_path
):
    # The probed steps tap the guard's watched tensors in their own pass: the same rows, so the
    # same report as the guard alone, whether the tripped step is probed or not.
    alone, alone_weights = watched_alone(case)
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=every_n_steps)
    probed, probed_weights = _fit_watched(case, [probe])
    assert alone is not None
    assert _report_fields(probed) == _report_fields(alone)
    assert probed.kind == ("activation" if case == "forward_activation" else "pred_grad")
    for got, want in zip(probed_weights, alone_weights):
        np.testing.assert_array_equal(got, want)


def test_a_clean_fit_watching_everything_with_a_probe_trains_like_plain_fit(tmp_path):
    x, y = guard_data()
    model = _tanh_model()
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    records = []
    _fit(model, x, y, [guard, kgrad.GradientProbe(str(tmp_path), every_n_steps=2, on_probe=records.append)])
    assert guard.report is None
    assert [record.step for record in records] == [0, 2, 4, 6]
    _assert_weights_of_plain_fit(model, _tanh_model, initial, x, y)
