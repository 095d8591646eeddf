"""TensorFlow's spike rule judges a step against its window's mean and σ (`window_statistics`).

They must be those of the window's accepted rows after every step (NumPy's mean and sample σ
here), unchanged bit for bit by a skipped step, and forgotten with the window
(kgrad/backends/tensorflow/guard/spikes.py). TensorFlow only (JAX's rule: tests/jax/).
"""

import numpy as np
import tensorflow as tf

from kgrad.backends.tensorflow.guard.spike_window import window_statistics
from kgrad.backends.tensorflow.guard.spikes import SpikeState
from kgrad.plan.spike_rule import SpikeRule

WINDOW = 4


def statistics(state):
    return np.stack([part.numpy() for part in window_statistics(state.window, state.accepted, WINDOW)])


def test_the_statistics_are_the_windows_after_every_step():
    state = SpikeState(SpikeRule(window=WINDOW, warmup=2, max_skips=99, row_capacity=16), 1)
    rng = np.random.default_rng(0)
    nan, rows = tf.constant(np.full(3, np.nan, np.float32)), []
    for step in range(10):
        values = rng.normal(size=3).astype(np.float32)
        accepted = step % 3 != 2  # every third step skipped: the window and its statistics kept
        before = statistics(state)
        state.after_step(tf.constant(values), tf.constant(not accepted), tf.constant(0.0), nan, nan,
                         tf.constant(accepted))
        mean, std = statistics(state)
        if not accepted:
            np.testing.assert_array_equal(statistics(state), before)  # NaN equals NaN here
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
    assert np.isnan(statistics(state)).all()
