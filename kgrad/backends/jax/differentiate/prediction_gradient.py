"""`kgrad.prediction_gradient` on JAX: dJ/dŷ of a loss, evaluated again on the prediction.

On JAX, Keras' cross-entropies on probabilities have no logits shortcut (that is
TensorFlow's ``_keras_logits``), so dJ/dŷ is connected; this gives it with the
same arguments and meaning as on TensorFlow, for a model's own ``train_step``
or any code that holds a prediction: ``jax.grad`` of the loss as a function
of ŷ, the loss function's own reduction (Keras' ``"sum_over_batch_size"``: each
row carries a factor 1/batch size), a per-example loss averaged.
"""

import jax
import jax.numpy as jnp
import keras

from kgrad.backends.common.losses import as_loss, compiled_loss_gradient


def prediction_gradient(loss_fn, y_true, y_pred, sample_weight=None):
    """Returns dJ/dŷ, the gradient of a loss with respect to the prediction.

    Args:
        loss_fn: Any loss ``model.compile`` accepts: a name
            (``"sparse_categorical_crossentropy"``), a ``keras.losses.Loss``,
            a function ``loss_fn(y_true, y_pred)`` (or with ``sample_weight``)
            returning a scalar or per-example losses, or a compiled model
            (its compiled loss, with every output's loss and weight).
        y_true: Targets.
        y_pred: The prediction (an array or nested structure).
        sample_weight: Optional per-example weights, passed to ``loss_fn``.

    Returns:
        dJ/dŷ with the structure and shapes of ``y_pred``.

    Example:

    >>> import jax.numpy as jnp, kgrad
    >>> y_pred = jnp.array([[0.2, 0.8]])
    >>> gradient = kgrad.prediction_gradient("mse", jnp.array([[0.0, 1.0]]), y_pred)
    >>> [round(float(value), 4) for value in gradient[0]]  # 2 (ŷ - y) / 2 outputs
    [0.2, -0.2]
    """
    if isinstance(loss_fn, keras.Model):
        return compiled_loss_gradient(prediction_gradient, loss_fn, y_true, y_pred, sample_weight)
    loss_fn = as_loss(loss_fn)

    def loss(prediction):
        if sample_weight is None:
            value = loss_fn(y_true, prediction)
        else:
            value = loss_fn(y_true, prediction, sample_weight=sample_weight)
        return jnp.mean(value)

    return jax.grad(loss)(y_pred)
