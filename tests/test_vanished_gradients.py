"""Statistics of gradients that vanished to ~1e-22, against NumPy in float64.

Their squares (~1e-44) are below float32's smallest normal number, and the
CPU flushes them to 0: a plain sum of squares read a norm and a standard
deviation of 0, on both backends, for the gradients a vanishing-gradient
diagnosis is about. kgrad's fast paths now take the rescaled, exact path
when a sum of squares is too small to be exact (`kgrad.backends.common.norms.TINY_SQUARES`).
The model is linear and the loss scaled by 1e-22, so the gradients have a
closed form. Runs on both backends (tests/jax/test_vanished_gradients_jax.py).
"""

import keras
import numpy as np
import pytest

import kgrad

SCALE, BATCH = 1e-22, 4


def _tiny_mse(y_true, y_pred):
    return SCALE * keras.ops.mean(keras.ops.square(y_pred - y_true), axis=-1)


def _fitted_once(log_dir, statistics, jit_compile):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8, name="hidden", bias_initializer="ones"),
        keras.layers.Dense(1, use_bias=False, name="out"),
    ], name="linear")
    model.compile(keras.optimizers.SGD(0.1), _tiny_mse, jit_compile=jit_compile)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, 6)).astype("float32")
    y = rng.normal(size=(BATCH, 1)).astype("float32")
    before = [np.array(w, np.float64) for w in model.get_weights()]
    probe = kgrad.GradientProbe(str(log_dir), every_n_steps=1, statistics=statistics)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[probe])
    return x.astype(np.float64), y.astype(np.float64), before


def _reference(x, y, before):
    """The gradients by hand (float64): h = x W1 + b1, ŷ = h W2, J = 1e-22 · mean((ŷ - y)²)."""
    kernel, bias, second = before
    hidden = x @ kernel + bias
    prediction_grad = SCALE * 2.0 * (hidden @ second - y) / len(x)
    hidden_grad = prediction_grad @ second.T
    return {
        "hidden/kernel": x.T @ hidden_grad, "hidden/bias": hidden_grad.sum(0),
        "out/kernel": hidden.T @ prediction_grad, "hidden": hidden_grad, "out": prediction_grad,
    }


def _logged(log_dir):
    scalars = kgrad.read_logs(log_dir)["kgrad"]["scalars"]
    return {tag: float(values[-1]) for tag, (_, values) in scalars.items()}


@pytest.mark.parametrize("jit_compile", [False, True], ids=["not_jitted", "jitted"])
def test_norms_and_spreads_of_gradients_of_1e_22_equal_float64(tmp_path, jit_compile):
    reference = _reference(*_fitted_once(tmp_path, "all", jit_compile))
    logged = _logged(tmp_path)
    expected = {}
    for name in ("hidden/kernel", "hidden/bias", "out/kernel"):
        expected[f"weight_grad_norm/{name}"] = np.linalg.norm(reference[name])
        expected[f"weight_grad_std/{name}"] = reference[name].std()
    for layer in ("hidden",):
        expected[f"grad_norm/{layer}"] = np.linalg.norm(reference[layer])
        expected[f"grad_std/{layer}"] = reference[layer].std()
    expected["pred_grad_norm/output"] = np.linalg.norm(reference["out"])
    expected["global/grad_norm"] = np.sqrt(sum(np.sum(reference[name] ** 2)
                                               for name in ("hidden/kernel", "hidden/bias", "out/kernel")))
    assert min(expected.values()) > 1e-24, expected  # what is checked is tiny indeed
    got = {tag: logged[tag] for tag in expected}
    np.testing.assert_allclose(list(got.values()), list(expected.values()), rtol=1e-5,
                               err_msg=f"logged {got}\nexpected {expected}")


def test_the_default_probes_norms_of_gradients_of_1e_22_equal_float64(tmp_path):
    # statistics="default": a bias's gradient only enters global/grad_norm (one sum of squares each).
    reference = _reference(*_fitted_once(tmp_path, "default", None))
    logged = _logged(tmp_path)
    names = ("hidden/kernel", "hidden/bias", "out/kernel")
    expected = {"weight_grad_norm/hidden/kernel": np.linalg.norm(reference["hidden/kernel"]),
                "grad_norm/hidden": np.linalg.norm(reference["hidden"]),
                "global/grad_norm": np.sqrt(sum(np.sum(reference[name] ** 2) for name in names))}
    got = {tag: logged[tag] for tag in expected}
    np.testing.assert_allclose(list(got.values()), list(expected.values()), rtol=1e-5,
                               err_msg=f"logged {got}\nexpected {expected}")


@pytest.mark.parametrize("jit_compile", [False, True], ids=["not_jitted", "jitted"])
def test_the_guards_report_bounds_a_last_finite_loss_of_1e_22_and_never_says_0(jit_compile):
    # The guard keeps each checked tensor's float32 sum of squares on the last finite step: for a
    # loss of ~1e-22 it is ~1e-44, flushed to 0, and the report said "its L2 norm was 0".
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, name="out")], name="linear")
    model.compile(keras.optimizers.SGD(0.1), _tiny_mse, jit_compile=jit_compile)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2 * BATCH, 6)).astype("float32")
    y = rng.normal(size=(2 * BATCH, 1)).astype("float32")
    x[BATCH, 0] = np.nan  # the second step's loss is NaN: the first step is the last finite one
    kernel, bias = (np.array(w, np.float64) for w in model.get_weights())
    first_loss = SCALE * np.mean((x[:BATCH] @ kernel + bias - y[:BATCH]) ** 2)
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    assert (report.step, report.kind, report.last_finite_step) == (1, "loss", 0)
    assert report.last_finite_norm is None  # not 0: too small for a float32 sum of squares
    assert first_loss < report.last_finite_norm_below < 1e-12
    assert f"its L2 norm was below {report.last_finite_norm_below:.2g}" in str(report)
