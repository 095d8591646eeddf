"""References computed another way than kgrad does, shared by the tests."""

import numpy as np
import tensorflow as tf


def central_difference(fn, x, eps=1e-6):
    """d fn / dx of a scalar function, by central differences in float64.

    Args:
        fn: Takes a float64 tensor shaped like ``x``, returns a scalar.
        x: The point (array-like).
        eps: The step.

    Returns:
        A float64 NumPy array shaped like ``x``, one element at a time.
    """
    x = np.array(x, dtype=np.float64)
    gradient = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[index] = eps
        plus = float(fn(tf.constant(x + step)))
        minus = float(fn(tf.constant(x - step)))
        gradient[index] = (plus - minus) / (2 * eps)
    return gradient
