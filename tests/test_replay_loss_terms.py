"""A loss that is non-finite through one of its terms is named at that term.

Keras' training loss is the compiled loss plus every layer's ``add_loss``
terms plus the weights' regularization losses. When the forward pass is
finite and the total is not, the replay names the term: the layer that added
it, the weight whose regularizer overflowed, or the compiled loss.
"""

import keras
import numpy as np
import pytest

import kgrad
from kgrad.backends.tensorflow.guard.loss_parts import loss_parts

BATCH = 4
BAD_STEP = 2  # the batch whose targets turn the penalty's term negative


def _data(samples=24):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.5, size=(samples, 3)).astype("float32")
    y = rng.normal(size=(samples, 1)).astype("float32")
    return x, y


@keras.saving.register_keras_serializable("kgrad_tests")
class Penalty(keras.layers.Layer):
    """Passes its input through and adds sqrt(mean(input) - 10): NaN where that mean is below 10."""

    def call(self, h):
        self.add_loss(keras.ops.sqrt(keras.ops.mean(h) - 10.0))
        return h


def _fit(model, x, y, jit_compile, loss="mse"):
    model.compile(keras.optimizers.SGD(1e-3), loss, jit_compile=jit_compile)
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, callbacks=[guard], verbose=0)
    return guard.report


def _born(report):
    return (report.step, report.born_in, report.born_at, report.born_type, report.born_path)


def _penalized(nested, scale_by=20.0, out_regularizer=None):
    """x -> Dense "scale" (x * 20, exactly, frozen) -> Penalty -> Dense "out"; nested: Penalty in a model."""
    keras.utils.set_random_seed(1)
    scale = keras.layers.Dense(3, name="scale", trainable=False)
    scale.build((None, 3))
    scale.set_weights([scale_by * np.eye(3, dtype="float32"), np.zeros(3, "float32")])
    penalty = Penalty(name="penalty")
    if nested:
        penalty = keras.Sequential([keras.Input((3,)), penalty], name="block")
    out = keras.layers.Dense(1, name="out", kernel_regularizer=out_regularizer)
    return keras.Sequential([keras.Input((3,)), scale, penalty, out])


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("nested", [False, True])
def test_nan_from_a_layers_add_loss_is_named_at_that_layer(jit_compile, nested):
    x, y = _data()
    x[BAD_STEP * BATCH : (BAD_STEP + 1) * BATCH] = 0.1  # 20 * 0.1 = 2 < 10: sqrt of a negative
    report = _fit(_penalized(nested), x, y, jit_compile)
    path = "block/penalty" if nested else "penalty"
    assert _born(report) == (BAD_STEP, "forward", "penalty", "add_loss of Penalty", path)
    assert (report.born_nan_count, report.born_inf_count, report.batch_index) == (1, 0, BAD_STEP)
    assert report.kind == "loss" and report.replayed  # the sentinel saw the total loss
    assert f"born in the forward pass at 'penalty' (add_loss of Penalty, path '{path}')" in str(report)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_an_overflowing_regularization_loss_is_named_at_its_weight(jit_compile):
    x, y = _data()
    keras.utils.set_random_seed(1)
    huge = keras.regularizers.L2(1e38)  # 1e38 * sum(kernel**2) = 4e38: Inf in float32
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, name="hidden", bias_regularizer=keras.regularizers.L2(1e-3)),
        keras.layers.Dense(1, name="out", kernel_initializer=keras.initializers.RandomUniform(1, 2),
                           kernel_regularizer=huge),
    ])
    kernel = model.get_layer("out").kernel.numpy()
    assert float(np.sum(np.square(kernel))) * 1e38 > float(np.finfo(np.float32).max)
    report = _fit(model, x, y, jit_compile)
    assert _born(report) == (0, "forward", "out/kernel", "L2 regularization loss", "out/kernel")
    assert (report.born_nan_count, report.born_inf_count) == (0, 1)
    # The finite range of the regularizer's input: the kernel at the last finite weights (step 0's).
    assert report.born_input_range == (float(kernel.min()), float(kernel.max()))
    np.testing.assert_array_equal(model.get_layer("out").kernel.numpy(), kernel)  # not applied


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_non_finite_compiled_loss_beside_finite_terms_is_named_the_loss(jit_compile):
    x, y = _data()
    y = np.abs(y) + 0.1
    y[BAD_STEP * BATCH] = -1.0  # log of a negative target: NaN in the compiled loss only

    def log_error(y_true, y_pred):
        return keras.ops.mean(keras.ops.square(keras.ops.log(y_true) - y_pred))

    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, name="hidden", kernel_regularizer=keras.regularizers.L2(1e-3)),
        keras.layers.Dense(1, name="out"),
    ])
    report = _fit(model, x, y, jit_compile, loss=log_error)
    assert _born(report)[:4] == (BAD_STEP, "forward", "loss", "loss")
    assert report.born_nan_count == 1


def test_loss_parts_add_up_to_the_loss_keras_computes():
    x, y = _data()
    model = _penalized(nested=True, scale_by=30.0, out_regularizer=keras.regularizers.L1(0.01))
    model.compile("sgd", "mse")
    prediction = model(x[:BATCH], training=True)
    total = model._compute_loss(x=x[:BATCH], y=y[:BATCH], y_pred=prediction, training=True)
    parts = loss_parts(model, y[:BATCH], prediction, None)
    assert [(p["name"], p["type"], p["path"]) for p in parts] == [
        ("penalty", "add_loss of Penalty", "block/penalty"),
        ("loss", "loss", "loss"),
        ("out/kernel", "L1 regularization loss", "out/kernel"),
    ]
    np.testing.assert_allclose(sum(float(p["value"]) for p in parts), float(total), rtol=1e-6)
