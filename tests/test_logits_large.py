"""The logits instrument stays finite and right for logits above 88, where exp(z) overflows float32.

exp(88.7) is float32's largest finite number: a log-sum-exp, entropy or top-1
probability computed from exp(z) directly is Inf or NaN from there on. Checked
against NumPy in float64 (shifted by the max), on the backend's own
`logit_statistics` and through a real fit whose softmax classifier has logits of
several hundred, read back from the probe.
"""

import keras
import numpy as np
import pytest

import kgrad

LARGE = np.array([
    [1000.0, 1000.0, -1000.0, 0.0],  # two equal, very large: lse = 1000 + log 2, entropy log 2
    [89.0, 90.0, 88.5, 89.9],  # just above float32's exp overflow, close together
    [300.0, -5.0, 20.0, 299.0],
    [-400.0, -401.0, -1000.0, -399.5],  # large and negative: exp underflows to 0
], dtype="float32")


def reference(logits):
    """Per position, in float64, shifted by the max: max, log-sum-exp, entropy (nats), top-1 probability."""
    z = np.asarray(logits, np.float64).reshape(-1, np.shape(logits)[-1])
    top = z.max(-1)
    lse = top + np.log(np.sum(np.exp(z - top[:, None]), -1))
    p = np.exp(z - lse[:, None])
    entropy = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1)
    return {"logit_max": top, "logit_lse": lse, "logit_entropy": entropy, "logit_top1_prob": p.max(-1)}


def tolerance(logits):
    """float32 rounds the logits to a few units of spacing at their largest magnitude."""
    return 8 * float(np.spacing(np.float32(np.abs(logits).max())))


def backend_statistics(logits):
    """``{kind: per-position values}`` from the backend's own `logit_statistics`."""
    if keras.backend.backend() == "jax":
        import jax.numpy as jnp

        from kgrad.backends.jax.summarize import logits as jax_logits

        # The JAX function returns (mean, max) over positions: one position at a time.
        rows = [jax_logits.logit_statistics(jnp.asarray(row[None])) for row in logits]
        return {kind: np.array([float(row[kind][0]) for row in rows]) for kind in rows[0]}
    import tensorflow as tf

    from kgrad.backends.tensorflow.summarize import logits as tf_logits

    return {kind: values.numpy() for kind, values in tf_logits.logit_statistics(tf.constant(logits)).items()}


def test_logit_statistics_of_large_logits_are_finite_and_equal_numpy():
    found, expected = backend_statistics(LARGE), reference(LARGE)
    assert set(found) == set(expected)
    for kind, values in found.items():
        assert np.all(np.isfinite(values)), (kind, values)
        np.testing.assert_allclose(values, expected[kind], rtol=1e-6, atol=tolerance(LARGE), err_msg=kind)
    np.testing.assert_allclose(found["logit_entropy"][0], np.log(2), atol=tolerance(LARGE))


def test_a_fit_with_logits_of_several_hundred_logs_them_finite_and_right(tmp_path):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype("float32")
    y = rng.integers(0, 3, size=16)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh", name="hidden"),
                              keras.layers.Dense(3, activation="softmax", name="out")])
    out = model.get_layer("out")
    out.kernel.assign(out.kernel.numpy() * 200.0)
    out.bias.assign(np.array([400.0, 0.0, -300.0], "float32"))
    model.compile(keras.optimizers.SGD(1e-6), "sparse_categorical_crossentropy", jit_compile=False)
    hidden = model.get_layer("hidden")
    logits = np.tanh(x @ np.asarray(hidden.kernel) + np.asarray(hidden.bias)) @ np.asarray(out.kernel) + np.asarray(
        out.bias)
    assert logits.max() > 88  # exp would overflow float32
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["logits"], overwrite=True)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[probe])
    scalars = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    for kind, values in reference(logits).items():
        for stat, reduce in (("mean", np.mean), ("max", np.max)):
            tag = f"{kind}_{stat}/output"
            (logged,) = scalars[tag].values
            assert np.isfinite(logged), tag
            assert logged == pytest.approx(reduce(values), rel=1e-5, abs=tolerance(logits)), tag
