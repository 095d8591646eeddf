"""A spike whose gradient norm is beyond float32's squares is skipped, and its values are exact (issue 55).

A batch with sample weights of 1e20 gives gradients of ~1e20: every element is
finite, but their float32 sum of squares overflows (a norm above ~1.8e19). The
spike rule then cannot take the norm's logarithm from the guard's sums; it
counts such a norm as a spike (score +Inf) where every element is finite
(`tests/test_spike_rule_beyond_squares.py`). Before, both backends left it
unjudged: the update put Inf into Adam's second moment and the weights were NaN
two steps later. It spikes in the warm-up too, where no window judges yet: applied
there, it wrecked the run as it does later. The skip's per-weight gradient norms and cos(g, w) are checked
against a float64 gradient worked out by hand (they were Inf and 0 on
TensorFlow, whose norms were plain sums of squares; JAX's exact norm of a
one-element bias was 0 under jit). Runs on both backends
(tests/jax/test_spike_skipping_overflow_jax.py).
"""

import keras
import numpy as np
import pytest

import kgrad

SPIKE_STEP, BATCH, STEPS = 36, 4, 40
#: A step inside the warm-up (``spike_warmup=16``): three accepted steps before it.
WARM_UP_STEP = 3


def _model(jit_compile="auto"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="tanh", name="hidden"),
        keras.layers.Dense(1, name="out"),
    ])
    model.compile(keras.optimizers.Adam(1e-3), "mse", jit_compile=jit_compile)
    return model


def _data(weight, step=SPIKE_STEP):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 4)).astype("float32")
    y = rng.normal(size=(STEPS * BATCH, 1)).astype("float32")
    sample_weight = np.ones(STEPS * BATCH, "float32")
    sample_weight[step * BATCH : (step + 1) * BATCH] = weight
    return x, y, sample_weight


def _fitted(weight, jit_compile="auto", step=SPIKE_STEP):
    x, y, sample_weight = _data(weight, step)
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_warmup=16)
    model = _model(jit_compile)
    model.fit(x, y, sample_weight=sample_weight, batch_size=BATCH, shuffle=False, verbose=0,
              callbacks=[guard])
    return guard, model


def _reference(weight, step=SPIKE_STEP):
    """``({path: gradient norm}, {path: cos(g, w)})`` of the spiking batch, by hand in float64.

    The weights before it are an unguarded fit's over the batches before it (the guard changes
    no step it applies); the loss is Keras' mean squared error weighted by the samples, summed
    and divided by the batch's size.
    """
    x, y, sample_weight = _data(weight, step)
    model, rows = _model(), slice(0, step * BATCH)
    model.fit(x[rows], y[rows], batch_size=BATCH, shuffle=False, verbose=0)
    kernel, bias, out_kernel, out_bias = (np.asarray(w, np.float64) for w in model.get_weights())
    rows = slice(step * BATCH, (step + 1) * BATCH)
    xb, yb, wb = (np.asarray(a[rows], np.float64) for a in (x, y, sample_weight))
    hidden = np.tanh(xb @ kernel + bias)
    d_out = 2.0 * (hidden @ out_kernel + out_bias - yb) * wb[:, None] / BATCH
    d_pre = (d_out @ out_kernel.T) * (1.0 - hidden**2)
    pairs = {"hidden/kernel": (xb.T @ d_pre, kernel), "hidden/bias": (d_pre.sum(0), bias),
             "out/kernel": (hidden.T @ d_out, out_kernel), "out/bias": (d_out.sum(0), out_bias)}
    norms = {path: float(np.linalg.norm(g)) for path, (g, _) in pairs.items()}
    cosines = {path: float(np.sum(g * w) / (np.linalg.norm(g) * np.linalg.norm(w)))
               for path, (g, w) in pairs.items()}
    return norms, cosines


def test_a_spike_of_gradients_of_1e8_is_skipped():
    guard, _ = _fitted(1e8)
    assert [skipped.step for skipped in guard.skipped_steps] == [SPIKE_STEP]
    assert guard.report is None


@pytest.mark.parametrize("jit_compile", ["auto", True], ids=["default", "xla"])
def test_a_spike_of_gradients_of_1e20_is_skipped_though_its_squares_overflow(jit_compile):
    if jit_compile is True and keras.backend.backend() == "jax":
        pytest.skip("TensorFlow's XLA step (JAX jits by default)")
    guard, _ = _fitted(1e20, jit_compile)
    assert [skipped.step for skipped in guard.skipped_steps] == [SPIKE_STEP]
    assert guard.report is None  # without the skip, Adam's moments hold Inf and the weights go NaN
    norms, cosines = _reference(1e20)
    (skipped,) = guard.skipped_steps
    assert np.hypot.reduce(list(norms.values())) > 1.9e19  # the global norm's squares beyond float32
    assert skipped.values["grad_norm"] == pytest.approx(norms, rel=1e-5)
    assert skipped.values["cos_grad_weight"] == pytest.approx(cosines, rel=1e-4, abs=1e-5)


def test_in_the_warm_up_too_and_training_goes_on_as_without_the_batch():
    """No window judges yet, but no window is needed: applied, the step wrecked the run."""
    guard, model = _fitted(1e20, step=WARM_UP_STEP)
    assert [skipped.step for skipped in guard.skipped_steps] == [WARM_UP_STEP]
    assert guard.report is None  # before: the update was applied, and the guard stopped on a NaN
    norms, _ = _reference(1e20, WARM_UP_STEP)
    assert guard.skipped_steps[0].values["grad_norm"] == pytest.approx(norms, rel=1e-5)
    # Every later step trained as a plain fit does on the data without that batch.
    x, y, sample_weight = _data(1.0)
    kept = np.r_[0 : WARM_UP_STEP * BATCH, (WARM_UP_STEP + 1) * BATCH : STEPS * BATCH]
    plain = _model()
    plain.fit(x[kept], y[kept], sample_weight=sample_weight[kept], batch_size=BATCH, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
