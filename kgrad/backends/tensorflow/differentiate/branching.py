"""Gradients through a ``tf.cond``: sparse gradients cannot cross it as they are."""

import tensorflow as tf


def split_sparse(gradients):
    """Gradients to return from a ``tf.cond``: IndexedSlices as (values, indices)."""
    return [
        (gradient.values, gradient.indices) if isinstance(gradient, tf.IndexedSlices) else gradient
        for gradient in gradients
    ]


def join_sparse(gradients, weights):
    """Undoes `split_sparse`; ``dense_shape`` is the weight's static shape.

    An IndexedSlices' ``dense_shape`` returned by ``tf.cond`` is a runtime
    value that XLA needs as a compile-time constant: XLA then recompiles the
    step for every new batch (of Embedding ids), seconds per step.
    """
    return [
        tf.IndexedSlices(gradient[0], gradient[1], tf.constant(list(weight.shape), tf.int64))
        if isinstance(gradient, (tuple, list))
        else gradient
        for gradient, weight in zip(gradients, weights)
    ]
