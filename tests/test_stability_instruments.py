"""instruments=["optimizer"] and ["logits"] inside model.fit, against references computed another way.

The optimizer's: Adam's (and AdamW's, Nadam's, Adamax's) state read back after
each step and recomputed in NumPy. The logits': the model's own logits.

Backend-free (Keras and NumPy): tests/jax/test_instruments_jax.py runs on JAX the tests that
JAX's own do not hold already. There, Keras keeps the state outside the variables during a
fit, so the state read back between steps is read after one-step fits instead, and the
un-jitted sequence head and the loss are checked against float64 ``jax.grad``.
"""

import re

import keras
import numpy as np
import pytest

import kgrad

RTOL = 1e-4
B = 16


def _mlp(optimizer, jit_compile=False, activation="softmax", seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="tanh", name="hidden"),
        keras.layers.Dense(3, activation=activation, name="out"),
    ])
    model.compile(optimizer, "sparse_categorical_crossentropy", jit_compile=jit_compile)
    return model


def _data(samples=48):
    rng = np.random.default_rng(0)
    return rng.normal(size=(samples, 4)).astype("float32"), rng.integers(0, 3, size=(samples,))


class _StateReader(keras.callbacks.Callback):
    """Adam's state and the weights, read back before and after every step (host side)."""

    def __init__(self, optimizer, first, second):
        super().__init__()
        self.optimizer, self.first, self.second = optimizer, first, second
        self.steps = []

    def _read(self):
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        if not inner.built:  # before the first step: the moments start at zero
            zeros = {w.path: np.zeros(w.shape, "float32") for w in self.model.trainable_weights}
            weights = {w.path: np.asarray(w) for w in self.model.trainable_weights}
            return {"iterations": 0, "weights": weights, "first": zeros, "second": zeros}
        return {
            "iterations": int(np.asarray(inner.iterations)),
            "weights": {w.path: np.asarray(w) for w in self.model.trainable_weights},
            "first": {w.path: np.asarray(getattr(inner, self.first)[inner._get_variable_index(w)])
                      for w in self.model.trainable_weights},
            "second": {w.path: np.asarray(getattr(inner, self.second)[inner._get_variable_index(w)])
                       for w in self.model.trainable_weights},
        }

    def on_train_batch_begin(self, batch, logs=None):
        self.steps.append({"before": self._read()})

    def on_train_batch_end(self, batch, logs=None):
        self.steps[-1]["after"] = self._read()


def _reference(optimizer, rule, before, after, path, sigmas):
    """adam_rms and the outlier fraction of one weight, in float64 from the state."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    beta_1, beta_2, epsilon = (float(inner.beta_1), float(inner.beta_2), float(inner.epsilon))
    t = after["iterations"]
    m0, m = (state["first"][path].astype("float64") for state in (before, after))
    v = after["second"][path].astype("float64")
    g = (m - beta_1 * m0) / (1 - beta_1)  # m_t = β1·m_{t-1} + (1 − β1)·g
    if rule == "adamax":
        return np.sqrt(np.mean((g / (v + epsilon)) ** 2)), None
    if rule == "nadam":
        scaled = g / (np.sqrt(v / (1 - beta_2**t)) + epsilon)
    else:  # Keras' Adam: m̂·√(1 − β2^t)/(√v + ε), g in place of m̂
        scaled = g * np.sqrt(1 - beta_2**t) / (np.sqrt(v) + epsilon)
    m_hat, v_hat = m / (1 - beta_1**t), v / (1 - beta_2**t)
    variance = v_hat - m_hat**2
    outliers = np.mean((variance > 0) & (np.abs(g - m_hat) > sigmas * np.sqrt(np.maximum(variance, 0))))
    return np.sqrt(np.mean(scaled**2)), outliers


OPTIMIZERS = {
    "adam": (lambda: keras.optimizers.Adam(0.05), "adam", "_momentums", "_velocities"),
    "adamw": (lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1), "adam", "_momentums", "_velocities"),
    "nadam": (lambda: keras.optimizers.Nadam(0.05), "nadam", "_momentums", "_velocities"),
    "adamax": (lambda: keras.optimizers.Adamax(0.05), "adamax", "_m", "_u"),
    "clipped_adam": (lambda: keras.optimizers.Adam(0.05, global_clipnorm=0.05), "adam", "_momentums",
                     "_velocities"),
    "loss_scaled_adam": (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.05)), "adam",
                         "_momentums", "_velocities"),
}


@pytest.mark.parametrize(
    "name, jit_compile",
    [(name, False) for name in OPTIMIZERS] + [("adam", True)],
)
def test_optimizer_statistics_equal_numpy_from_the_state_read_back(tmp_path, name, jit_compile):
    make, rule, first, second = OPTIMIZERS[name]
    optimizer, sigmas = make(), 1.0  # k = 1: outliers on most steps, so that the fraction is tested
    model = _mlp(optimizer, jit_compile)
    records = []
    reader = _StateReader(optimizer, first, second)
    probe = kgrad.GradientProbe(
        tmp_path, every_n_steps=1, instruments=["optimizer"], outlier_sigmas=sigmas,
        on_probe=records.append,
    )
    x, y = _data()
    model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0, callbacks=[probe, reader])
    assert [record.step for record in records] == list(range(6))
    outlier_fractions = []
    for record, step in zip(records, reader.steps):
        for weight in ("hidden/kernel", "out/kernel"):
            path = f"{model.name}/{weight}"
            rms, outliers = _reference(optimizer, rule, step["before"], step["after"], path, sigmas)
            np.testing.assert_allclose(record.scalars[f"adam_rms/{weight}"], rms, rtol=RTOL, err_msg=weight)
            if outliers is None:
                assert f"grad_outlier_fraction/{weight}" not in record.scalars
            else:
                np.testing.assert_allclose(record.scalars[f"grad_outlier_fraction/{weight}"], outliers,
                                           rtol=RTOL, atol=1e-7)
                outlier_fractions.append(outliers)
            change = step["after"]["weights"][path] - step["before"]["weights"][path]
            update_rms = np.sqrt(np.mean(change.astype("float64") ** 2))
            np.testing.assert_allclose(record.scalars[f"update_rms/{weight}"], update_rms, rtol=RTOL)
        # Biases are left out by default, as their update_ratio/ is.
        assert not any(tag.endswith("/bias") for tag in record.scalars if tag.startswith("adam_rms/"))
    assert outlier_fractions == [] or 0 < max(outlier_fractions) < 1


@pytest.mark.parametrize(
    "optimizer, reason",
    [
        (lambda: keras.optimizers.SGD(0.1), "plain SGD keeps no state at all"),
        (lambda: keras.optimizers.SGD(0.1, momentum=0.9), "SGD with momentum keeps no second moment"),
        (lambda: keras.optimizers.Lion(0.01), "Lion (its update is the sign of a momentum"),
        (lambda: keras.optimizers.Adafactor(0.01), "Adafactor's second moment is factored"),
        (lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=2), "Adam accumulates gradients"),
    ],
)
def test_other_optimizers_give_update_rms_only_and_say_why(tmp_path, optimizer, reason):
    model = _mlp(optimizer())
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["optimizer"])
    x, y = _data(B)
    with pytest.warns(UserWarning, match=r"instruments=\['optimizer'\]: " + re.escape(reason)):
        model.fit(x, y, batch_size=B, epochs=1, verbose=0, callbacks=[probe])
    tags = set(probe.latest.scalars)
    assert not {tag for tag in tags if tag.startswith(("adam_rms/", "grad_outlier_fraction/"))}
    assert {"update_rms/hidden/kernel", "update_rms/out/kernel"} <= tags


def test_with_gradient_accumulation_records_carry_keras_iterations_and_training_is_unchanged():
    # Keras' `iterations` is then the counter divided by the accumulation steps: two batches
    # a step. (On JAX the counter is not the property: kgrad once failed looking for it.)
    x, y = _data(4 * B)
    plain = _mlp(keras.optimizers.Adam(0.01, gradient_accumulation_steps=2))
    plain.fit(x, y, batch_size=B, shuffle=False, verbose=0)
    probed = _mlp(keras.optimizers.Adam(0.01, gradient_accumulation_steps=2))
    records = []
    probe = kgrad.GradientProbe(every_n_steps=1, instruments=["optimizer"], on_probe=records.append)
    with pytest.warns(UserWarning, match="Adam accumulates gradients"):
        probed.fit(x, y, batch_size=B, shuffle=False, verbose=0, callbacks=[probe, kgrad.NonFiniteGuard()])
    assert [r.step for r in records] == [0, 0, 1, 1] and int(probed.optimizer.iterations) == 2
    for got, expected in zip(probed.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_training_is_unchanged_by_the_stability_instruments(tmp_path):
    x, y = _data()
    plain = _mlp(keras.optimizers.Adam(0.05))
    plain.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0)
    probed = _mlp(keras.optimizers.Adam(0.05))
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=2, instruments=["optimizer", "logits"])
    probed.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0, callbacks=[probe])
    for before, after in zip(plain.get_weights(), probed.get_weights()):
        np.testing.assert_array_equal(before, after)


def _expected_logit_tags(logits, name="output"):
    z = logits.astype("float64")
    z = z.reshape(-1, z.shape[-1])
    lse = np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)
    p = np.exp(z - lse[:, None])
    values = {
        "logit_max": z.max(-1),
        "logit_lse": lse,
        "logit_entropy": -np.sum(p * np.log(p), -1),
        "logit_top1_prob": p.max(-1),
    }
    return {
        f"{kind}_{stat}/{name}": reduce(series)
        for kind, series in values.items()
        for stat, reduce in (("mean", np.mean), ("max", np.max))
    }


@pytest.mark.parametrize("jit_compile", [False, True])
def test_logit_statistics_of_a_softmax_classifier_are_of_its_logits(tmp_path, jit_compile):
    x, y = _data(B)
    model = _mlp(keras.optimizers.SGD(0.1), jit_compile)
    # By hand, from the weights before the (only) step: the logits behind the softmax.
    kernel, bias, out_kernel, out_bias = model.get_weights()  # "hidden", then "out"
    logits = np.tanh(x @ kernel + bias) @ out_kernel + out_bias
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["logits"])
    model.fit(x, y, batch_size=B, epochs=1, verbose=0, callbacks=[probe])
    for tag, value in _expected_logit_tags(logits).items():
        np.testing.assert_allclose(probe.latest.scalars[tag], value, rtol=RTOL, err_msg=tag)
    # Of the logits, not of the probabilities: a probability is never above 1.
    assert probe.latest.scalars["logit_max_max/output"] == pytest.approx(logits.max(), rel=RTOL)


def test_logit_statistics_of_a_sequence_head_are_over_every_position(tmp_path):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((6,), dtype="int32")
    embedded = keras.layers.Embedding(11, 8, name="embed")(tokens)
    logits = keras.layers.Dense(11, name="lm_head")(keras.layers.Dense(8, activation="relu")(embedded))
    model = keras.Model(tokens, logits)
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 11, size=(B, 6)), rng.integers(0, 11, size=(B, 6))
    expected = _expected_logit_tags(np.asarray(model(x)))  # [B, T, V]: the model's own logits
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, capture=["weight_gradients"],
                                instruments=["logits", "optimizer"])
    model.fit(x, y, batch_size=B, epochs=1, verbose=0, callbacks=[probe])
    for tag, value in expected.items():
        np.testing.assert_allclose(probe.latest.scalars[tag], value, rtol=RTOL, err_msg=tag)
    assert "adam_rms/embed/embeddings" in probe.latest.scalars  # an Embedding's sparse gradient


def test_a_sigmoid_output_gets_no_logit_statistics_and_a_reason(tmp_path):
    model = _mlp(keras.optimizers.SGD(0.1), activation="sigmoid")
    model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy", jit_compile=False)
    x, _ = _data(B)
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["logits"])
    with pytest.warns(UserWarning, match=r"no logit statistics for 'output': a sigmoid output"):
        model.fit(x, np.ones((B, 3)), batch_size=B, epochs=1, verbose=0, callbacks=[probe])
    assert not [tag for tag in probe.latest.scalars if tag.startswith("logit_")]


def test_the_loss_is_logged_on_probed_steps(tmp_path):
    x, y = _data()
    model = _mlp(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.05)))
    losses = []
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, on_probe=losses.append)
    history = model.fit(x, y, batch_size=len(x), epochs=2, verbose=0, callbacks=[probe])
    # One step per epoch: the epoch's loss is the step's, unscaled.
    np.testing.assert_allclose([r.scalars["global/loss"] for r in losses], history.history["loss"], rtol=RTOL)
    logs = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    assert logs["global/loss"].steps.tolist() == [0, 1]


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "6", True])
def test_outlier_sigmas_must_be_a_positive_number(value):
    message = re.escape(f"`outlier_sigmas` must be a positive number. Received: outlier_sigmas={value!r}")
    with pytest.raises(ValueError, match=message):
        kgrad.GradientProbe(instruments=["optimizer"], outlier_sigmas=value)
