"""A ``LossScaleOptimizer``'s overflowing gradients inside the guard's check: its own, never a trip.

With spike skipping under loss scaling, the guard's rows hold the weight
gradients for the spike rule, but their NaN and Inf are the loss scaler's
signal (`kgrad.backends.tensorflow.guard.watched.scaler_owned`): a step whose
scaled gradients overflow is one the optimizer skips itself, lowering its
scale. The check leaves those rows out; the spike rule neither judges such a
step nor lets it into its window (`SpikeState.after_step`).

Example (graph code or eager):

>>> import tensorflow as tf
>>> finite, overflowed = finite_and_overflowed(
...     tf.constant([1.0, float("inf")]), ["loss/loss", "weight_grad/d/kernel"], {"weight_grad/d/kernel"})
>>> finite.numpy().tolist(), bool(overflowed)
([True, True], True)
"""

import tensorflow as tf


def finite_and_overflowed(half_squares, names, owned):
    """``(finite, overflowed)``: which sums count as finite, and whether an ``owned`` row overflowed.

    Args:
        half_squares: The every-step sums of squares, one per name of ``names``.
        names: The every-step tensors' names.
        owned: The names the loss scaler owns (``overflowed`` is ``None`` when empty).
    """
    finite = tf.math.is_finite(half_squares)
    if not owned:
        return finite, None
    mask = tf.constant([name in owned for name in names])
    overflowed = tf.logical_not(tf.reduce_all(tf.logical_or(finite, tf.logical_not(mask))))
    return tf.logical_or(finite, mask), overflowed


def without_owned(counts, names, owned):
    """``counts`` (``[len(names), 2]``) with the ``owned`` rows' NaN/Inf counts set to 0."""
    if not owned:
        return counts
    mask = tf.constant([[name in owned] for name in names])
    return tf.where(mask, tf.zeros_like(counts), counts)
