"""‖w‖ before and ‖Δw‖ after, in one pass or several, equal each weight's NumPy norm; NaN and Inf show."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from kgrad.backends.tensorflow.summarize.weight_snapshots import WeightSnapshots

SHAPES = [(3, 4), (5,), (), (2, 3, 2)]


@pytest.mark.parametrize("chunk_entries", [1 << 22, 16, 1])
def test_norms_before_and_changes_equal_numpy_per_weight(chunk_entries):
    rng = np.random.default_rng(0)
    weights = [keras.Variable(rng.normal(size=shape).astype("float32")) for shape in SHAPES]
    before = [weight.numpy().astype("float64") for weight in weights]
    snapshots = WeightSnapshots(keras.Sequential([keras.Input((1,))]), chunk_entries=chunk_entries)
    norms = tf.function(lambda: snapshots.norms_before(weights))()  # graph code, as in the step
    np.testing.assert_allclose(norms.numpy(), [np.linalg.norm(w) for w in before], rtol=1e-6)
    for weight in weights:
        weight.assign(weight.value + rng.normal(size=weight.shape).astype("float32"))
    changes = tf.function(lambda: snapshots.changes(weights))()
    expected = [np.linalg.norm(w.numpy().astype("float64") - old) for w, old in zip(weights, before)]
    np.testing.assert_allclose(changes.numpy(), expected, rtol=1e-5)


def test_a_nan_or_inf_entry_shows_in_its_own_weights_norm_only():
    weights = [keras.Variable([1.0, np.nan]), keras.Variable([3.0, 4.0]), keras.Variable([np.inf, 0.0])]
    snapshots = WeightSnapshots(keras.Sequential([keras.Input((1,))]))
    norms = snapshots.norms_before(weights).numpy()
    assert np.isnan(norms[0]) and norms[1] == 5.0 and norms[2] == np.inf
