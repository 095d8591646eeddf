"""The optimizer statistics of all weights in one pass equal a per-weight NumPy recomputation.

`moment_statistics` concatenates g, m and v of every weight and takes per-weight
means with one segment sum: here each weight's adam_rms and outlier fraction is
recomputed alone, in float64, from the state the optimizer holds before the step,
for Adam (with and without AMSGrad), Nadam and Adamax, in one pass and in several
(`chunk_entries`). An empty weight gets NaN, as a mean over nothing, never a zero.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from kgrad.backends.tensorflow.summarize.optimizer_state import moment_statistics

SHAPES = [(3, 4), (5,), (), (2, 3, 2)]
SIGMAS = 1.0  # most entries outliers or not at random: the fraction is not 0 or 1


def _optimizer(name):
    return {
        "adam": lambda: keras.optimizers.Adam(0.01),
        "amsgrad": lambda: keras.optimizers.Adam(0.01, amsgrad=True),
        "adamw": lambda: keras.optimizers.AdamW(0.01),
        "nadam": lambda: keras.optimizers.Nadam(0.01),
        "adamax": lambda: keras.optimizers.Adamax(0.01),
    }[name]()


def _state_names(name):
    if name == "adamax":
        return ["_m", "_u"]
    return ["_momentums", "_velocities"] + (["_velocity_hats"] if name == "amsgrad" else [])


def _built(name, shapes, rng, iterations=3000):
    """An optimizer over weights of ``shapes``, its state set to random values (v ≥ 0)."""
    weights = [keras.Variable(np.zeros(shape, "float32")) for shape in shapes]
    optimizer = _optimizer(name)
    optimizer.build(weights)
    optimizer.iterations.assign(iterations)
    for state in _state_names(name):
        for variable in getattr(optimizer, state):
            values = 0.1 * rng.normal(size=variable.shape)
            if state not in ("_momentums", "_m"):
                values = 0.5 + np.abs(values)  # second moments, u: not negative, above m²
            variable.assign(values.astype("float32"))
    return optimizer


def _reference(name, optimizer, index, gradient):
    """adam_rms and the outlier fraction of one weight, in float64, as Keras' update_step moves the state."""
    beta_1, beta_2, epsilon = float(optimizer.beta_1), float(optimizer.beta_2), float(optimizer.epsilon)
    t = int(optimizer.iterations.numpy()) + 1
    g = gradient.astype("float64")
    if name == "adamax":
        u = np.maximum(beta_2 * optimizer._u[index].numpy().astype("float64"), np.abs(g))
        return np.sqrt(np.mean((g / (u + epsilon)) ** 2)), None
    m = beta_1 * optimizer._momentums[index].numpy().astype("float64") + (1 - beta_1) * g
    v = beta_2 * optimizer._velocities[index].numpy().astype("float64") + (1 - beta_2) * g**2
    if name == "nadam":
        scaled = g / (np.sqrt(v / (1 - beta_2**t)) + epsilon)
    else:
        denominator = v
        if name == "amsgrad":
            denominator = np.maximum(optimizer._velocity_hats[index].numpy().astype("float64"), v)
        scaled = g * np.sqrt(1 - beta_2**t) / (np.sqrt(denominator) + epsilon)
    m_hat, v_hat = m / (1 - beta_1**t), v / (1 - beta_2**t)
    variance = v_hat - m_hat**2
    outliers = (variance > 0) & (np.abs(g - m_hat) > SIGMAS * np.sqrt(np.maximum(variance, 0)))
    return np.sqrt(np.mean(scaled**2)), np.mean(outliers)


@pytest.mark.parametrize("name", ["adam", "amsgrad", "adamw", "nadam", "adamax"])
@pytest.mark.parametrize("chunk_entries", [1 << 22, 16, 1])
def test_one_pass_equals_each_weight_recomputed_in_numpy(name, chunk_entries):
    rng = np.random.default_rng(0)
    optimizer = _built(name, SHAPES, rng)
    gradients = [2 * rng.normal(size=shape).astype("float32") for shape in SHAPES]
    # Out of order, as the optimizer's indices of the summarized weights may be.
    indices = [2, 0, 3, 1]
    rms, outliers = moment_statistics(
        "nadam" if name == "nadam" else "adamax" if name == "adamax" else "adam",
        optimizer, indices, [tf.constant(gradients[index]) for index in indices], SIGMAS,
        chunk_entries=chunk_entries,
    )
    expected = [_reference(name, optimizer, index, gradients[index]) for index in indices]
    np.testing.assert_allclose(rms.numpy(), [e[0] for e in expected], rtol=1e-5)
    if name == "adamax":
        assert outliers is None
    else:
        np.testing.assert_allclose(outliers.numpy(), [e[1] for e in expected], rtol=1e-6, atol=1e-7)
        assert any(0 < e[1] < 1 for e in expected)  # the fraction is tested, not only 0 or 1


def test_an_empty_weight_gets_nan_and_the_others_their_values():
    rng = np.random.default_rng(1)
    shapes = [(3,), (2, 0), (4,)]
    optimizer = _built("adam", shapes, rng)
    gradients = [rng.normal(size=shape).astype("float32") for shape in shapes]
    rms, outliers = moment_statistics(
        "adam", optimizer, [0, 1, 2], [tf.constant(g) for g in gradients], SIGMAS
    )
    assert np.isnan(rms.numpy()[1]) and np.isnan(outliers.numpy()[1])
    for position in (0, 2):
        expected_rms, expected_outliers = _reference("adam", optimizer, position, gradients[position])
        np.testing.assert_allclose(rms.numpy()[position], expected_rms, rtol=1e-5)
        np.testing.assert_allclose(outliers.numpy()[position], expected_outliers, atol=1e-7)
