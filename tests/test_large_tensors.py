"""Statistics of a tensor of 2**24 elements (a 4096 x 4096 kernel), against NumPy in float64.

A float32 sum of that many terms added one after another stops growing once
each term is below its rounding step: on Keras' JAX backend, XLA's CPU
backend adds the terms of a reduction of several operands that way, and the
norm of such a kernel came out 1.5% low, its gradient's too (kgrad's JAX
statistics read a tensor once, through such a reduction). The reference
here is computed by hand in float64: the model is linear, so its gradients
have a closed form. Runs on both backends (tests/jax/test_large_tensors_jax.py).
"""

import keras
import numpy as np
import pytest

import kgrad

WIDTH, BATCH, LEARNING_RATE = 4096, 4, 0.1


def _fitted_once(log_dir, jit_compile):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((WIDTH,)),
        keras.layers.Dense(WIDTH, use_bias=False, name="wide"),
        keras.layers.Dense(1, use_bias=False, name="out"),
    ], name="linear")
    model.compile(keras.optimizers.SGD(LEARNING_RATE), "mse", jit_compile=jit_compile)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, WIDTH)).astype("float32")
    y = rng.normal(size=(BATCH, 1)).astype("float32")
    before = [np.array(w, np.float64) for w in model.get_weights()]
    probe = kgrad.GradientProbe(str(log_dir), every_n_steps=1, statistics="all", histograms=False)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[probe])
    after = [np.array(w, np.float64) for w in model.get_weights()]
    return x.astype(np.float64), y.astype(np.float64), before, after


def _reference(x, y, before):
    """The loss's gradients by hand (float64): ŷ = x W1 W2, J = mean((ŷ - y)²)."""
    first, second = before
    hidden = x @ first
    prediction_grad = 2.0 * (hidden @ second - y) / len(x)
    hidden_grad = prediction_grad @ second.T
    return {"first": x.T @ hidden_grad, "hidden_grad": hidden_grad, "hidden": hidden}


@pytest.mark.parametrize("jit_compile", [False, True], ids=["not_jitted", "jitted"])
def test_statistics_of_a_tensor_of_2_to_the_24_elements_equal_float64(tmp_path, jit_compile):
    x, y, before, after = _fitted_once(tmp_path, jit_compile)
    reference = _reference(x, y, before)
    scalars = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]

    def logged(tag):
        steps, values = scalars[tag]
        assert len(values) == 1, (tag, steps)
        return float(values[0])

    gradient, kernel = reference["first"], before[0]
    assert gradient.size == kernel.size == 2**24
    expected = {
        "weight_norm/wide/kernel": np.linalg.norm(kernel),
        "weight_grad_norm/wide/kernel": np.linalg.norm(gradient),
        "weight_grad_std/wide/kernel": gradient.std(),
        "weight_grad_max/wide/kernel": gradient.max(),
        "weight_grad_min/wide/kernel": gradient.min(),
        "update_ratio/wide/kernel": np.linalg.norm(after[0] - kernel) / np.linalg.norm(kernel),
        "grad_norm/wide": np.linalg.norm(reference["hidden_grad"]),
        "activation_norm/wide": np.linalg.norm(reference["hidden"]),
    }
    got = {tag: logged(tag) for tag in expected}
    np.testing.assert_allclose(list(got.values()), list(expected.values()), rtol=2e-5,
                               err_msg=f"logged {got}\nexpected {expected}")
    # The mean is near 0 beside the spread: its error is judged against the spread.
    assert abs(logged("weight_grad_mean/wide/kernel") - gradient.mean()) <= 1e-5 * gradient.std()
    # The update the probe measured is the one SGD applied: Δw = -lr · g.
    np.testing.assert_allclose(logged("update_ratio/wide/kernel"),
                               LEARNING_RATE * np.linalg.norm(gradient) / np.linalg.norm(kernel), rtol=1e-4)
