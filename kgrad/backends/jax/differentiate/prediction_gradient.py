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
    """`kgrad.prediction_gradient` on JAX: ``jax.grad`` of ``loss_fn`` as a function of ``y_pred``.

    Example (no logits shortcut on JAX: the loss's own gradient is the same):

    >>> import jax, jax.numpy as jnp, keras
    >>> y_pred = keras.layers.Softmax()(jnp.array([[1.0, 2.0, 3.0]]))
    >>> y_true = jnp.array([[0.0, 0.0, 1.0]])
    >>> loss = keras.losses.CategoricalCrossentropy()
    >>> direct = jax.grad(lambda prediction: loss(y_true, prediction))(y_pred)
    >>> bool(jnp.allclose(prediction_gradient(loss, y_true, y_pred), direct))
    True
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
