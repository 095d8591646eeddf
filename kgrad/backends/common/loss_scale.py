"""Whether an optimizer scales the loss it is given (mixed precision, ``loss_scale_factor``).

Backend-free: each backend divides the scale back out of what it reports, so
that kgrad's gradients are of the true loss.

>>> import keras
>>> scales_loss(keras.optimizers.SGD()), scales_loss(keras.optimizers.SGD(loss_scale_factor=8.0))
(False, True)
"""

import keras


def scales_loss(optimizer):
    """Whether ``optimizer.scale_loss`` multiplies the loss (mixed precision, or
    a ``loss_scale_factor``), so that gradients must be divided back."""
    return optimizer is not None and (
        isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        or getattr(optimizer, "loss_scale_factor", None) is not None
    )
