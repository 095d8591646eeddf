"""`kgrad.NonFiniteGuard(watch="all")`: where a step first goes non-finite, one test run under each backend.

Backend-free test code (Keras and NumPy only): ``python -m pytest`` runs it on
TensorFlow, and tests/jax/test_guard_watch_jax.py imports these tests into the
JAX run (``KERAS_BACKEND=jax python -m pytest tests/jax``), so that the two
backends are held to the same expectations by the same lines.
"""

import keras
import numpy as np
import pytest

import kgrad
from fit_helpers import guard_data, middle_model

BATCH = 4


def _fit(model, x, y, callbacks, jit_compile):
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=jit_compile)
    model.fit(x, y, batch_size=BATCH, shuffle=False, callbacks=callbacks, verbose=0)
    return model


JIT = pytest.mark.parametrize("jit_compile", [False, True], ids=["no_jit", "jit"])
# Eager JAX steps are slow (18 s for the case below on 2 loaded cores): on JAX, where a birth in
# each pass is also found eagerly by the cases above and below, this one runs jitted only.
JIT_ONLY_ON_JAX = pytest.mark.parametrize(
    "jit_compile", [True] if keras.config.backend() == "jax" else [False, True],
    ids=["jit"] if keras.config.backend() == "jax" else ["no_jit", "jit"],
)


@JIT
def test_nan_from_log_of_negative_names_the_middle_layer(jit_compile):
    x, y = guard_data()
    model = middle_model(lambda t: keras.ops.log(t))
    model.build((None, 3))
    # `first` outputs x - 2 after this kernel and bias: negative from the start.
    model.get_layer("first").set_weights([np.eye(3, 4, dtype="float32"), -2 * np.ones(4, "float32")])
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    _fit(model, x, y, [guard], jit_compile)
    report = guard.report
    assert (report.step, report.layer, report.kind, report.pass_) == (0, "middle", "activation", "forward")
    assert report.nan_count == BATCH * 4 and report.inf_count == 0
    assert report.last_finite_step is None
    assert report.born_at == "middle"  # the replay agrees


@JIT_ONLY_ON_JAX
def test_inf_from_an_overflowing_exp_with_the_last_finite_norm_of_that_activation(jit_compile):
    x, y = guard_data()
    x[8:12] *= 200.0  # batch 2 overflows exp in float32
    make = lambda: middle_model(lambda t: keras.ops.exp(t), name="exp")  # noqa: E731
    model = make()
    model.build((None, 3))
    model.get_layer("first").set_weights([np.eye(3, 4, dtype="float32"), np.zeros(4, "float32")])
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    _fit(model, x, y, [guard], jit_compile)
    report = guard.report
    assert (report.step, report.layer, report.kind, report.pass_) == (2, "exp", "activation", "forward")
    assert report.inf_count > 0 and report.last_finite_step == 1
    # The reference: exp's output on batch 1 after one plain step on batch 0.
    reference = make()
    reference.set_weights(initial)
    _fit(reference, x[:4], y[:4], [], jit_compile)
    activation = keras.Model(reference.inputs[0], reference.get_layer("exp").output)(x[4:8])
    assert report.last_finite_norm == pytest.approx(float(np.linalg.norm(activation)), rel=1e-5)


@JIT
def test_nan_born_in_the_backward_pass_of_sqrt_at_zero_is_the_gradient_of_the_layer_before(jit_compile):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, name="first"),
        keras.layers.Lambda(lambda t: keras.ops.relu(t) * 0.0, name="zeros"),
        keras.layers.Lambda(lambda t: keras.ops.sqrt(t), name="root"),
        keras.layers.Dense(1, name="out"),
    ])
    x, y = guard_data()
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    _fit(model, x, y, [guard], jit_compile)
    report = guard.report
    # Forward is finite (sqrt(0) = 0); d sqrt/dt at 0 is infinite, so the first
    # non-finite tensor from the loss down is dJ/d(output of `zeros`).
    assert (report.step, report.pass_, report.kind, report.layer) == (0, "backward", "grad", "zeros")
    assert "grad/root" not in report.non_finite
