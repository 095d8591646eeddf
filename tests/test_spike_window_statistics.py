"""TensorFlow's spike rule keeps its window's mean and σ for the next step (`SpikeState.statistics`).

A step's judgement reads them from a variable written after the step before
(kgrad/backends/tensorflow/guard/spikes.py), so that only a comparison waits for the
gradients. They must be those of the window's accepted rows after every step (NumPy's mean and
sample σ here), unchanged bit for bit by a skipped step, and forgotten with the window.
TensorFlow only (JAX's rule reduces its window inside the step: tests/jax/).
"""

import numpy as np
import tensorflow as tf

from kgrad.backends.tensorflow.guard.spikes import SpikeState
from kgrad.plan.spike_rule import SpikeRule

WINDOW = 4


def test_the_kept_statistics_are_the_windows_after_every_step():
    state = SpikeState(SpikeRule(window=WINDOW, warmup=2, max_skips=99, row_capacity=16), 1)
    rng = np.random.default_rng(0)
    nan, rows = tf.constant(np.full(3, np.nan, np.float32)), []
    for step in range(10):
        values = rng.normal(size=3).astype(np.float32)
        accepted = step % 3 != 2  # every third step skipped: the window and its statistics kept
        before = state.statistics.numpy()
        state.after_step(tf.constant(values), tf.constant(not accepted), tf.constant(0.0), nan, nan,
                         tf.constant(accepted))
        mean, std = state.statistics.numpy()
        if not accepted:
            np.testing.assert_array_equal(state.statistics.numpy(), before)  # NaN equals NaN here
            continue
        rows.append(values)
        last = np.array(rows[-WINDOW:], np.float64)
        if len(last) < 2:  # σ needs two rows
            assert np.isnan(mean).all() and np.isnan(std).all()
            continue
        np.testing.assert_allclose(mean, last.mean(axis=0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(std, last.std(axis=0, ddof=1), rtol=1e-5, atol=1e-6)
    assert len(rows) > WINDOW  # the window wrapped
    state.reset(everything=True)
    assert np.isnan(state.statistics.numpy()).all()
