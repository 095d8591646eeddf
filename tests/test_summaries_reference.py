"""The probed summaries of a real ``fit`` step equal a reference computed another way.

The reference re-runs the first training batch by hand: a forward pass written
with plain TensorFlow ops from the initial weights, one ordinary
``tf.GradientTape``, and statistics and histograms computed with NumPy. The
probe computes the same quantities inside Keras' step, with its own taps,
shadow loss and on-device summaries; only float32 round-off separates them.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad

BATCH = 8
BUCKETS = 5
LEARNING_RATE = 0.1
L2 = 0.05
RTOL, ATOL = 1e-4, 1e-6


def _moments(values):
    """NumPy version of the documented ``<stat>`` summaries."""
    values = np.asarray(values, np.float64).ravel()
    return {
        "norm": np.sqrt(np.sum(values**2)),
        "mean": values.mean(),
        "std": values.std(),
        "min": values.min(),
        "max": values.max(),
        "zero_fraction": np.mean(values == 0.0),
        "nonfinite": 0.0,
    }


def _assert_tensor_summaries(record, kind, name, reference):
    for stat, expected in _moments(reference).items():
        actual = record.scalars[f"{kind}_{stat}/{name}"]
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=f"{kind}_{stat}/{name}")
    buckets = record.histograms[f"{kind}_hist/{name}"]
    values = np.asarray(reference, np.float64).ravel()
    counts, edges = np.histogram(values, bins=BUCKETS, range=(values.min(), values.max()))
    assert buckets.shape == (BUCKETS, 3)
    assert buckets[:, 2].sum() == values.size
    np.testing.assert_array_equal(buckets[:, 2], counts, err_msg=f"{kind}_hist/{name}")
    np.testing.assert_allclose(buckets[:, 0], edges[:-1], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(buckets[:, 1], edges[1:], rtol=RTOL, atol=ATOL)


def _classifier():
    inputs = keras.Input((4,), name="features")
    hidden = keras.layers.Dense(
        5, activation="relu", kernel_regularizer=keras.regularizers.L2(L2), name="hidden"
    )(inputs)
    logits = keras.layers.Dense(3, name="logits")(hidden)
    # A softmax output with sparse cross-entropy: Keras computes the training
    # loss from the logits, the case where dJ/dŷ needs the shadow loss.
    probabilities = keras.layers.Activation("softmax", name="probs")(logits)
    return keras.Model(inputs, probabilities)


def _batch():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(BATCH, 4)).astype("float32")
    y = rng.integers(0, 3, size=(BATCH,))
    sample_weight = np.linspace(0.0, 2.0, BATCH).astype("float32")
    return x, y, sample_weight


def _manual_step(weights, x, y, sample_weight):
    """Activations and gradients of the first batch, from an ordinary tape."""
    kernel1, bias1, kernel2, bias2 = (tf.Variable(w) for w in weights)
    x = tf.constant(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        hidden = tf.nn.relu(x @ kernel1 + bias1)
        tape.watch(hidden)
        logits = hidden @ kernel2 + bias2
        tape.watch(logits)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        loss = tf.reduce_sum(per_example * sample_weight) / BATCH
        loss += L2 * tf.reduce_sum(tf.square(kernel1))
    variables = [kernel1, bias1, kernel2, bias2]
    gradients = tape.gradient(loss, variables + [hidden, logits, x])
    probabilities = tf.nn.softmax(logits).numpy().astype(np.float64)
    return {
        "hidden": hidden.numpy(),
        "logits": logits.numpy(),
        "weight_grads": [g.numpy() for g in gradients[:4]],
        "grad_hidden": gradients[4].numpy(),
        "grad_logits": gradients[5].numpy(),
        "input_grad": gradients[6].numpy(),
        "probabilities": probabilities,
    }


def _prediction_gradient(probabilities, y, sample_weight):
    # J = Σ w_i (-log(p_iy / Σ_j p_ij)) / B for Keras' cross-entropy on
    # probabilities, so dJ/dp_ij = w_i (1 - [j = y_i] / p_iy) / B.
    one_hot = np.eye(probabilities.shape[1])[y]
    p_true = probabilities[np.arange(len(y)), y][:, None]
    return sample_weight[:, None] * (1.0 - one_hot / p_true) / BATCH


@pytest.fixture(scope="module", params=[False, True], ids=["graph", "xla"])
def probed_step(request):
    """One real fit step probed by GradientProbe, and the weights around it."""
    keras.utils.set_random_seed(0)
    model = _classifier()
    model.compile(
        optimizer=keras.optimizers.SGD(LEARNING_RATE),
        loss="sparse_categorical_crossentropy",
        jit_compile=request.param,
    )
    x, y, sample_weight = _batch()
    before = model.get_weights()
    probe = kgrad.GradientProbe(
        None, layers=["hidden", "logits"], every_n_steps=1, bucket_count=BUCKETS, statistics="all"
    )
    model.fit(
        x, y, sample_weight=sample_weight, batch_size=BATCH, epochs=1,
        shuffle=False, verbose=0, callbacks=[probe],
    )
    reference = _manual_step(before, x, y, sample_weight)
    return probe.latest, before, model.get_weights(), reference, (x, y, sample_weight)


def test_record_is_the_first_step(probed_step):
    record = probed_step[0]
    assert record.step == 0


def test_activations_match(probed_step):
    record, _, _, reference, _ = probed_step
    _assert_tensor_summaries(record, "activation", "hidden", reference["hidden"])
    _assert_tensor_summaries(record, "activation", "logits", reference["logits"])


def test_activation_gradients_match(probed_step):
    record, _, _, reference, _ = probed_step
    _assert_tensor_summaries(record, "grad", "hidden", reference["grad_hidden"])
    _assert_tensor_summaries(record, "grad", "logits", reference["grad_logits"])


def test_input_gradient_matches(probed_step):
    record, _, _, reference, _ = probed_step
    _assert_tensor_summaries(record, "input_grad", "input", reference["input_grad"])


def test_prediction_gradient_matches_closed_form(probed_step):
    record, _, _, reference, (_, y, sample_weight) = probed_step
    expected = _prediction_gradient(reference["probabilities"], y, sample_weight)
    _assert_tensor_summaries(record, "pred_grad", "output", expected)
    example_norms = np.linalg.norm(expected, axis=1)
    np.testing.assert_allclose(
        record.scalars["pred_grad_example_norm_mean/output"], example_norms.mean(), rtol=RTOL
    )
    np.testing.assert_allclose(
        record.scalars["pred_grad_example_norm_max/output"], example_norms.max(), rtol=RTOL
    )
    # The first example has sample weight 0: its row of dJ/dŷ is exactly 0.
    assert record.scalars["pred_grad_zero_fraction/output"] >= 1 / BATCH


def test_weight_gradients_and_global_norm_match(probed_step):
    record, _, _, reference, _ = probed_step
    paths = ["hidden/kernel", "hidden/bias", "logits/kernel", "logits/bias"]
    for path, gradient in zip(paths, reference["weight_grads"]):
        _assert_tensor_summaries(record, "weight_grad", path, gradient)
    global_norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in reference["weight_grads"]))
    np.testing.assert_allclose(record.scalars["global/grad_norm"], global_norm, rtol=RTOL)


def test_the_applied_update_is_the_reference_gradient(probed_step):
    _, before, after, reference, _ = probed_step
    for w_before, w_after, gradient in zip(before, after, reference["weight_grads"]):
        np.testing.assert_allclose(w_after, w_before - LEARNING_RATE * gradient, rtol=RTOL, atol=ATOL)


def test_weight_norms_and_update_ratios_match(probed_step):
    record, before, after, _, _ = probed_step
    paths = ["hidden/kernel", "hidden/bias", "logits/kernel", "logits/bias"]
    for path, w_before, w_after in zip(paths, before, after):
        w_before = w_before.astype(np.float64)
        norm = np.linalg.norm(w_before)
        np.testing.assert_allclose(record.scalars[f"weight_norm/{path}"], norm, rtol=RTOL, atol=ATOL)
        # Biases start at zero: as documented, their ratio is ‖Δw‖/‖w after‖.
        scale = norm if norm > 0 else np.linalg.norm(w_after)
        ratio = np.linalg.norm(w_after - w_before) / scale
        np.testing.assert_allclose(record.scalars[f"update_ratio/{path}"], ratio, rtol=RTOL)


def test_multi_output_prediction_gradients_use_each_loss_and_weight():
    # Regression: the shadow loss once kept only the first output's loss, so
    # dJ/dŷ of every other output was reported as exactly zero.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,), name="features")
    hidden = keras.layers.Dense(6, activation="tanh", name="hidden")(inputs)
    outputs = {
        "a": keras.layers.Dense(2, name="a")(hidden),
        "b": keras.layers.Dense(3, activation="softmax", name="b")(hidden),
    }
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer="sgd",
        loss={"a": "mse", "b": "sparse_categorical_crossentropy"},
        loss_weights={"a": 0.5, "b": 2.0},
        jit_compile=False,
    )
    x, y_b, _ = _batch()
    y_a = np.random.default_rng(1).normal(size=(BATCH, 2)).astype("float32")
    prediction = model.predict(x, verbose=0)
    probe = kgrad.GradientProbe(
        None, capture=["prediction_gradient"], every_n_steps=1, bucket_count=BUCKETS, statistics="all"
    )
    model.fit(
        x, {"a": y_a, "b": y_b}, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe]
    )
    expected_a = 0.5 * 2.0 * (prediction["a"].astype(np.float64) - y_a) / (BATCH * 2)
    expected_b = 2.0 * _prediction_gradient(
        prediction["b"].astype(np.float64), y_b, np.ones(BATCH)
    )
    _assert_tensor_summaries(probe.latest, "pred_grad", "a", expected_a)
    _assert_tensor_summaries(probe.latest, "pred_grad", "b", expected_b)
