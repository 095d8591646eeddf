"""Loss scaling (mixed precision, ``loss_scale_factor``): kgrad reports gradients of the unscaled loss."""

import tensorflow as tf

from kgrad.backends.common.loss_scale import scales_loss  # noqa: F401  (imported from here too)


def inverse_loss_scale(optimizer):
    """Graph code: 1 / the factor ``optimizer.scale_loss`` multiplies a loss by now, or ``None``.

    Read it before the update: a ``LossScaleOptimizer``'s update changes its scale.
    """
    if not scales_loss(optimizer):
        return None
    return 1.0 / tf.cast(optimizer.scale_loss(tf.constant(1.0)), tf.float32)


def unscaler(optimizer):
    """Graph code: ``fn(gradient) -> float32 gradient of the true loss``, unscaled if the loss was scaled."""
    inverse_scale = inverse_loss_scale(optimizer)
    if inverse_scale is not None:
        return lambda tensor: tf.cast(tensor, tf.float32) * inverse_scale
    # A multiply by 1 would be one more pass over every gradient.
    return lambda tensor: tf.cast(tensor, tf.float32)
