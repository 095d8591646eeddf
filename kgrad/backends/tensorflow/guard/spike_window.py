"""The window of TensorFlow's spike rule, in graph code: its mean and σ, and a norm beyond its squares.

`kgrad.backends.tensorflow.guard.spikes.SpikeState.judge` judges a step's
logarithms against `window_statistics`; `beyond_squares` says where the
logarithm of the global norm cannot be taken from float32 sums of squares.

Example (a loss of 1 and a norm whose squares overflowed, every element finite: True)::

    beyond_squares(tf.constant([1.0, float("inf")]), tf.constant(True))
"""

import tensorflow as tf


def beyond_squares(raw, gradients_finite):
    """Graph code: whether the step's global norm overflowed float32's squares though every element is
    finite (``raw``: the loss and the norm; the loss finite): a spike at any step, as on JAX.

    The warm-up included: such a norm needs no window to be called a spike, and its
    update, applied, wrecks the run (Adam's second moment takes Inf, the weights NaN
    a few steps later; a plain step moves the weights by ~1e16 times the rate).
    """
    overflowed = tf.logical_and(tf.math.is_inf(raw[1]), tf.math.is_finite(raw[0]))
    return tf.logical_and(overflowed, gradients_finite)


def window_statistics(window, accepted, length):
    """Graph code: ``(mean, std)`` per column of the window's accepted rows (NaN before two of them).

    σ is the sample standard deviation (n − 1), as `kgrad.plan.spike_rule.judge`'s.

    Args:
        window: ``[length, columns]``: the window, rows written in turn.
        accepted: How many rows were ever written (int64).
        length: The window's length N.

    Example (mean [2.], std [1.4142135]: the third row was never written)::

        mean, std = window_statistics(tf.constant([[1.0], [3.0], [0.0]]), tf.constant(2, tf.int64), 3)
    """
    filled = tf.minimum(accepted, length)
    count = tf.cast(filled, tf.float32)
    in_window = tf.cast(tf.range(length, dtype=tf.int64) < filled, tf.float32)[:, None]
    # Rows past `filled` were never written (zeros): the mask keeps a NaN loss inside only.
    mean = tf.reduce_sum(window * in_window, 0) / tf.maximum(count, 1.0)
    squares = tf.reduce_sum(tf.square((window - mean) * in_window), 0)
    std = tf.sqrt(squares / tf.maximum(count - 1.0, 1.0))
    enough = filled >= 2
    return tf.where(enough, mean, float("nan")), tf.where(enough, std, float("nan"))
