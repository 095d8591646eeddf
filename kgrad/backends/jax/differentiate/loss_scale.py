"""The loss scale inside the JAX step: kgrad reports the gradients of the true loss.

Keras' JAX ``compute_loss_and_updates`` differentiates ``optimizer.scale_loss(loss)``
(a `keras.optimizers.LossScaleOptimizer`'s dynamic scale under ``mixed_float16``,
or an optimizer's fixed ``loss_scale_factor``); the gradients it returns are
scaled by that factor. The factor is read from the step's optimizer variables,
before the update (a LossScaleOptimizer's update changes it).
"""

import jax.numpy as jnp
import keras
from keras.src import backend

from kgrad.backends.common.loss_scale import scales_loss


def inverse_loss_scale(optimizer, optimizer_variables):
    """1 / the factor the step's loss was scaled by (a float32 scalar), or ``None`` when unscaled.

    Example:

    >>> import keras
    >>> optimizer = keras.optimizers.SGD(loss_scale_factor=8.0)
    >>> optimizer.build([keras.Variable(1.0)])
    >>> float(inverse_loss_scale(optimizer, [v.value for v in optimizer.variables]))
    0.125
    """
    if not scales_loss(optimizer):
        return None
    mapping = list(zip(optimizer.variables, optimizer_variables))
    with backend.StatelessScope(state_mapping=mapping):
        scale = optimizer.scale_loss(jnp.float32(1.0))
    return 1.0 / jnp.asarray(scale, jnp.float32)


def skips_overflowed_steps(optimizer):
    """Whether ``optimizer`` skips the update of a step whose scaled gradients overflowed."""
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
