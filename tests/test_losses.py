"""`kgrad.prediction_gradient`: dJ/dŷ, also where Keras takes the logits shortcut.

The reference is the same loss applied to a *plain* float64 probability
tensor (no ``_keras_logits``), differentiated by central finite differences.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from references import central_difference

MODES = ["eager", "function", "xla"]
F64 = "float64"


def _compiled(fn, mode):
    if mode == "eager":
        return fn
    return tf.function(fn, jit_compile=mode == "xla")


def _shortcut_case(kind):
    """(activation ending the model, loss, targets) where Keras uses the logits."""
    rng = np.random.default_rng(1)
    if kind == "categorical":
        targets = tf.constant(np.eye(3)[[0, 2, 1, 2]], dtype=F64)
        return "softmax", keras.losses.CategoricalCrossentropy(dtype=F64), targets
    if kind == "sparse":
        targets = tf.constant([[0], [2], [1], [2]])
        return "softmax", keras.losses.SparseCategoricalCrossentropy(dtype=F64), targets
    targets = tf.constant(rng.integers(0, 2, size=(4, 3)), dtype=F64)
    return "sigmoid", keras.losses.BinaryCrossentropy(dtype=F64), targets


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["categorical", "sparse", "binary"])
def test_plain_tape_gives_none_and_kgrad_matches_finite_differences(kind, mode):
    activation_name, loss_fn, targets = _shortcut_case(kind)
    activation = keras.layers.Activation(activation_name, dtype=F64)
    logits = tf.random.normal((4, 3), dtype=F64)
    plain_gradient_was_none = []

    def run(logits):
        with tf.GradientTape() as tape:
            y_pred = activation(logits)
            tape.watch(y_pred)
            loss = loss_fn(targets, y_pred)
        # The trap: Keras computed the loss from `y_pred._keras_logits`.
        plain_gradient_was_none.append(tape.gradient(loss, y_pred) is None)
        return y_pred, kgrad.prediction_gradient(loss_fn, targets, y_pred)

    y_pred, gradient = _compiled(run, mode)(logits)
    assert plain_gradient_was_none == [True]
    expected = central_difference(lambda p: loss_fn(targets, p), y_pred)
    np.testing.assert_allclose(gradient, expected, rtol=1e-6, atol=1e-9)
    assert gradient.shape == y_pred.shape and gradient.dtype == tf.float64


def test_categorical_gradient_has_the_closed_form():
    # Keras normalizes p by its sum, so d/dp of -log(p_t / sum p) is
    # -y/p + 1 per row; the mean over the batch divides by the batch size.
    loss_fn = keras.losses.CategoricalCrossentropy(dtype=F64)
    y_pred = keras.layers.Softmax(dtype=F64)(tf.random.normal((5, 4), dtype=F64))
    targets = tf.constant(np.eye(4)[[0, 1, 2, 3, 0]], dtype=F64)
    gradient = kgrad.prediction_gradient(loss_fn, targets, y_pred)
    np.testing.assert_allclose(gradient, (-targets / y_pred + 1.0) / 5.0, rtol=1e-12)


@pytest.mark.parametrize("mode", ["eager", "xla"])
def test_sample_weight_is_part_of_the_loss(mode):
    _, loss_fn, targets = _shortcut_case("categorical")
    y_pred = keras.layers.Softmax(dtype=F64)(tf.random.normal((4, 3), dtype=F64))
    weights = tf.constant([1.0, 0.0, 2.0, 0.5], dtype=F64)
    gradient = _compiled(
        lambda p: kgrad.prediction_gradient(loss_fn, targets, p, sample_weight=weights), mode
    )(y_pred)
    expected = central_difference(lambda p: loss_fn(targets, p, sample_weight=weights), y_pred)
    np.testing.assert_allclose(gradient, expected, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(gradient[1], np.zeros(3))  # weight 0: no gradient


def test_mean_reduction_carries_a_one_over_batch_factor():
    y_pred = keras.layers.Softmax(dtype=F64)(tf.random.normal((4, 3), dtype=F64))
    _, mean_loss, targets = _shortcut_case("categorical")
    sum_loss = keras.losses.CategoricalCrossentropy(reduction="sum", dtype=F64)
    mean_gradient = kgrad.prediction_gradient(mean_loss, targets, y_pred)
    sum_gradient = kgrad.prediction_gradient(sum_loss, targets, y_pred)
    np.testing.assert_allclose(4.0 * mean_gradient, sum_gradient, rtol=1e-12)
    # Doubling the batch with the same examples halves every row.
    doubled = kgrad.prediction_gradient(
        mean_loss, tf.concat([targets, targets], 0), tf.concat([y_pred, y_pred], 0)
    )
    np.testing.assert_allclose(doubled[:4], mean_gradient / 2.0, rtol=1e-12)


def test_per_example_losses_are_averaged():
    y_true = tf.constant([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]], dtype=F64)
    y_pred = tf.constant([[1.5, 2.0], [2.0, 5.0], [1.0, -1.0]], dtype=F64)

    def per_example(y_true, y_pred):
        return tf.reduce_sum(tf.square(y_pred - y_true), axis=-1)

    gradient = kgrad.prediction_gradient(per_example, y_true, y_pred)
    np.testing.assert_allclose(gradient, 2.0 * (y_pred - y_true) / 3.0, rtol=1e-12)


@pytest.mark.parametrize("structure", ["dict", "list"])
def test_multi_output_gradient_has_the_structure_of_the_prediction(structure):
    classes = keras.layers.Softmax(dtype=F64)(tf.random.normal((3, 4), dtype=F64))
    values = tf.random.normal((3, 2), dtype=F64)
    class_targets = tf.constant(np.eye(4)[[1, 3, 0]], dtype=F64)
    value_targets = tf.zeros((3, 2), dtype=F64)
    cce = keras.losses.CategoricalCrossentropy(dtype=F64)
    mse = keras.losses.MeanSquaredError(dtype=F64)

    def pack(a, b):
        return {"cls": a, "reg": b} if structure == "dict" else [a, b]

    def unpack(pair):
        return (pair["cls"], pair["reg"]) if structure == "dict" else tuple(pair)

    def loss_fn(y_true, y_pred):
        (ct, vt), (cp, vp) = unpack(y_true), unpack(y_pred)
        return cce(ct, cp) + 0.5 * mse(vt, vp)

    gradient = kgrad.prediction_gradient(
        loss_fn, pack(class_targets, value_targets), pack(classes, values)
    )
    assert type(gradient) is (dict if structure == "dict" else list)
    class_gradient, value_gradient = unpack(gradient)
    np.testing.assert_allclose(
        class_gradient,
        central_difference(lambda p: cce(class_targets, p), classes),
        rtol=1e-6,
        atol=1e-9,
    )
    # d/dv of 0.5 * mean((v - 0)^2) over 3 x 2 elements.
    np.testing.assert_allclose(value_gradient, values / 6.0, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("structure", ["dict", "list"])
def test_a_multi_output_model_s_compiled_loss_before_its_first_use(structure, mode):
    # The compiled loss is built on its first call; kgrad's must be that call
    # too (it was: every output's gradient but the first came back as zeros).
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(5, activation="relu", name="hidden")(inputs)
    classes = keras.layers.Dense(3, activation="softmax", name="cls")(hidden)
    values = keras.layers.Dense(2, name="reg")(hidden)
    outputs = {"cls": classes, "reg": values} if structure == "dict" else [classes, values]
    model = keras.Model(inputs, outputs)
    model.compile(
        "sgd",
        loss=["sparse_categorical_crossentropy", "mse"],
        loss_weights=[1.0, 0.5],
        metrics=[["accuracy"], ["mae"]],
    )
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(6, 4)), tf.float32)
    y_cls = tf.constant(rng.integers(0, 3, 6))
    y_reg = tf.constant(rng.normal(size=(6, 2)), tf.float32)
    y = {"cls": y_cls, "reg": y_reg} if structure == "dict" else [y_cls, y_reg]
    prediction = model(x)
    gradient = _compiled(lambda p: kgrad.prediction_gradient(model, y, p), mode)(prediction)
    # Reference: the same loss written out, on a plain copy of the prediction.
    (cls_p, reg_p) = (prediction["cls"], prediction["reg"]) if structure == "dict" else prediction
    cls_p, reg_p = tf.identity(cls_p), tf.identity(reg_p)
    with tf.GradientTape() as tape:
        tape.watch([cls_p, reg_p])
        loss = keras.losses.sparse_categorical_crossentropy(y_cls, cls_p)
        loss = tf.reduce_mean(loss) + 0.5 * tf.reduce_mean(tf.square(reg_p - y_reg))
    expected = tape.gradient(loss, [cls_p, reg_p])
    (cls_g, reg_g) = (gradient["cls"], gradient["reg"]) if structure == "dict" else gradient
    np.testing.assert_allclose(cls_g, expected[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(reg_g, expected[1], rtol=1e-5, atol=1e-7)
    assert np.abs(reg_g).max() > 0
    # No loss metric counted kgrad's evaluation.
    assert all(float(metric.count) == 0 for metric in model._compile_loss.metrics)


def test_training_loss_and_weight_gradients_are_unchanged():
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, activation="softmax", name="out")]
    )
    x = tf.random.normal((5, 3))
    targets = tf.constant(np.eye(4)[[0, 1, 2, 3, 0]], dtype="float32")
    loss_fn = keras.losses.CategoricalCrossentropy()

    def step(probe_prediction):
        with tf.GradientTape() as tape:
            y_pred = model(x)
            loss = loss_fn(targets, y_pred)
            if probe_prediction:
                kgrad.prediction_gradient(loss_fn, targets, y_pred)
        return y_pred, loss, tape.gradient(loss, model.trainable_variables)

    y_pred, loss, gradients = step(probe_prediction=True)
    _, plain_loss, plain_gradients = step(probe_prediction=False)
    assert hasattr(y_pred, "_keras_logits")  # the prediction was not altered
    # The loss still comes from the logits, exactly as Keras computes it.
    logits_loss = keras.losses.CategoricalCrossentropy(from_logits=True)
    np.testing.assert_allclose(loss, logits_loss(targets, y_pred._keras_logits), rtol=1e-6)
    np.testing.assert_array_equal(loss, plain_loss)
    for got, expected in zip(gradients, plain_gradients):
        np.testing.assert_array_equal(got, expected)


def test_keras_mask_of_the_prediction_is_kept():
    # A linear output has no logits shortcut, so a plain tape is the reference.
    model = keras.Sequential(
        [
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(5, 3, mask_zero=True),
            keras.layers.Dense(2),
        ]
    )
    tokens = tf.constant([[1, 2, 0, 0], [3, 0, 0, 0]])
    targets = tf.ones((2, 4, 2))
    loss_fn = keras.losses.MeanSquaredError()
    with tf.GradientTape() as tape:
        y_pred = model(tokens)
        tape.watch(y_pred)
        loss = loss_fn(targets, y_pred)
    expected = tape.gradient(loss, y_pred)
    gradient = kgrad.prediction_gradient(loss_fn, targets, y_pred)
    np.testing.assert_allclose(gradient, expected, rtol=1e-6)
    np.testing.assert_array_equal(gradient[0, 2:], np.zeros((2, 2)))  # masked steps


def test_inside_a_probe_tape_step():
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, activation="softmax", name="out")]
    )
    x = tf.random.normal((2, 3))
    targets = tf.constant([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    loss_fn = keras.losses.CategoricalCrossentropy()

    @tf.function(jit_compile=True)
    def step(x):
        with kgrad.ProbeTape(model) as tape:
            y_pred = model(x)
            loss = loss_fn(targets, y_pred)
        tape.gradient(loss, model.trainable_variables)
        return tape.probe.prediction, kgrad.prediction_gradient(
            loss_fn, targets, tape.probe.prediction
        )

    y_pred, gradient = step(x)
    np.testing.assert_allclose(gradient, (-targets / y_pred + 1.0) / 2.0, rtol=1e-5)


@pytest.mark.parametrize("loss_fn", [None, 3, ["mse"]])
def test_loss_fn_must_be_a_loss(loss_fn):
    with pytest.raises(
        TypeError,
        match=r"`loss_fn` must be a loss name, a keras\.losses\.Loss, a callable.*Received: loss_fn=",
    ):
        kgrad.prediction_gradient(loss_fn, tf.ones((1, 2)), tf.ones((1, 2)))
