"""A spike whose gradient norm is beyond float32's squares: pinned, not yet skipped (issue 55).

A batch with sample weights of 1e20 gives gradients of ~1e20: every element is
finite, but their float32 sum of squares overflows (a norm above ~1.8e19). Both
backends' spike rule takes ln of the global norm from those sums, and an
overflowed sum is left unjudged: the step is not skipped, its update puts Inf
into Adam's second moment, and the weights are NaN two steps later. The same
batch with 1e8 is skipped. The fix (issue 55's closing note of 2026-12-07) must
count such a norm as a spike where every element is finite and no loss scaler
owns the overflow; this test then passes and its mark goes. Runs on both
backends (tests/jax/test_spike_skipping_overflow_jax.py).
"""

import keras
import numpy as np
import pytest

import kgrad

SPIKE_STEP, BATCH, STEPS = 36, 4, 40


def _fitted(weight):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="tanh", name="hidden"),
        keras.layers.Dense(1, name="out"),
    ])
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 4)).astype("float32")
    y = rng.normal(size=(STEPS * BATCH, 1)).astype("float32")
    sample_weight = np.ones(STEPS * BATCH, "float32")
    sample_weight[SPIKE_STEP * BATCH : (SPIKE_STEP + 1) * BATCH] = weight
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_warmup=16)
    model.fit(x, y, sample_weight=sample_weight, batch_size=BATCH, shuffle=False, verbose=0,
              callbacks=[guard])
    return guard


def test_a_spike_of_gradients_of_1e8_is_skipped():
    guard = _fitted(1e8)
    assert [skipped.step for skipped in guard.skipped_steps] == [SPIKE_STEP]
    assert guard.report is None


@pytest.mark.xfail(strict=True, reason="issue 55: a global gradient norm whose float32 sum of squares "
                   "overflowed is not judged by the spike rule (both backends' `judge`), so the largest "
                   "spikes are applied; see this module's docstring")
def test_a_spike_of_gradients_of_1e20_is_skipped_though_its_squares_overflow():
    guard = _fitted(1e20)
    assert [skipped.step for skipped in guard.skipped_steps] == [SPIKE_STEP]
    assert guard.report is None  # without the skip, Adam's moments hold Inf and the weights go NaN
