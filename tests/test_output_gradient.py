"""The output layer's dJ/d(activation) survives Keras' logits shortcut."""

import keras
import numpy as np
import pytest

import kgrad


@pytest.mark.parametrize(
    "activation, loss, labels",
    [
        ("softmax", "sparse_categorical_crossentropy", lambda rng: rng.integers(0, 3, 16)),
        ("sigmoid", "binary_crossentropy", lambda rng: rng.integers(0, 2, (16, 3)).astype("float32")),
    ],
)
def test_output_layer_gradient_is_prediction_gradient(activation, loss, labels):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(5, activation="relu", name="hidden"),
            keras.layers.Dense(3, activation=activation, name="out"),
        ]
    )
    model.compile("sgd", loss)
    probe = kgrad.GradientProbe(every_n_steps=1, statistics="all")
    model.fit(x, labels(rng), batch_size=8, shuffle=False, callbacks=[probe], verbose=0)
    scalars = probe.latest.scalars
    # Keras differentiates the loss through the logits, so the output tensor
    # itself is cut from the tape; kgrad reports dJ/dŷ there instead of zeros.
    assert scalars["grad_norm/out"] > 0
    assert scalars["grad_zero_fraction/out"] < 1
    assert scalars["grad_norm/out"] == pytest.approx(scalars["pred_grad_norm/output"], rel=1e-6)
    assert scalars["grad_norm/hidden"] > 0


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_nan_example_makes_the_largest_example_norm_nan(jit_compile, tmp_path):
    # Under XLA TensorFlow's reduce_max drops a NaN: the max of the per-example norms of
    # dJ/dŷ must not look finite when one example's is NaN.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="out")])
    model.compile(keras.optimizers.SGD(0.0), "mse", jit_compile=jit_compile)
    x = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
    y = np.zeros((4, 2), "float32")
    y[2, 0] = np.nan
    records = []
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[kgrad.GradientProbe(
        str(tmp_path), statistics="all", on_probe=records.append)])
    scalars = records[0].scalars
    assert np.isnan(scalars["pred_grad_example_norm_max/output"])
    assert np.isnan(scalars["pred_grad_example_norm_mean/output"])
