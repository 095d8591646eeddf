"""The guard's replay under ``mixed_bfloat16``, one test run under each backend.

Backend-free test code (Keras and NumPy only): ``python -m pytest`` runs it on
TensorFlow, tests/jax/test_replay_mixed_precision_jax.py on JAX. The layers
compute in bfloat16, whose NumPy ``dtype.kind`` is ``"V"``, not ``"f"``: a
replay that counted only ``"f"`` arrays skipped them and blamed the loss (it
did on TensorFlow, while JAX named the layer).
"""

import keras
import numpy as np
import pytest

import kgrad

BATCH, BAD_ROW = 4, 9  # row 9 is in batch 2, i.e. step 2 of the first epoch


@pytest.fixture
def bfloat16_policy():
    keras.config.set_dtype_policy("mixed_bfloat16")
    yield
    keras.config.set_dtype_policy("float32")


def test_under_mixed_bfloat16_the_replay_names_the_layer_that_made_the_nan(bfloat16_policy):
    rng = np.random.default_rng(0)
    x = rng.uniform(1.5, 2.5, size=(32, 3)).astype("float32")  # sqrt(x - 1) finite, and its gradient
    y = rng.normal(size=(32, 1)).astype("float32")
    x[BAD_ROW, 0] = 0.5  # sqrt(0.5 - 1): NaN, in step 2 only
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Lambda(lambda t: keras.ops.sqrt(t - 1.0), name="bad_sqrt"),
                              keras.layers.Dense(1, name="out")])
    assert model.get_layer("bad_sqrt").compute_dtype == "bfloat16"
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=False)
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, callbacks=[guard], verbose=0)
    report = guard.report
    born = (report.step, report.born_in, report.born_at, report.born_type)
    assert born == (2, "forward", "bad_sqrt", "Lambda")
    assert report.replayed and (report.born_nan_count, report.born_inf_count) == (1, 0)
    assert report.born_input_range[0] == 0.5  # exact in bfloat16
