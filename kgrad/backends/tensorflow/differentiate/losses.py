"""dJ/d(prediction) that survives Keras' logits shortcut."""

import keras
import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.common.losses import as_loss, compiled_loss_gradient


def _plain_tensor(tensor):
    # `tf.identity` returns a tensor without the `_keras_logits` attribute that
    # softmax/sigmoid outputs carry (and, in graph mode, of another op type
    # than Softmax/Sigmoid), so the loss below is computed from the prediction
    # itself and its gradient is connected.
    copy = tf.identity(tensor)
    # The Keras mask, though, changes the loss (masked time steps do not
    # count): keep it, or dJ/dŷ would be that of another loss.
    mask = keras_internals.keras_mask(tensor)
    if mask is not None:
        keras_internals.set_keras_mask(copy, mask)
    return copy


def _plain_copy(y_pred):
    return tf.nest.map_structure(_plain_tensor, y_pred)


def prediction_gradient(loss_fn, y_true, y_pred, sample_weight=None):
    """`kgrad.prediction_gradient` on TensorFlow: ``loss_fn`` again on a plain copy of ``y_pred``.

    The loss is evaluated in a tape of its own. The copy (``tf.identity``, with
    the Keras mask kept) carries no ``_keras_logits``, so Keras' cross-entropies
    compute the loss from the prediction itself, not from the logits behind a
    softmax or sigmoid, and dJ/dŷ is connected.

    Example:

    >>> import keras, kgrad, tensorflow as tf
    >>> y_pred = keras.layers.Softmax()(tf.constant([[1.0, 2.0, 3.0]]))
    >>> y_true = tf.constant([[0.0, 0.0, 1.0]])
    >>> logits_loss = keras.losses.CategoricalCrossentropy()
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(y_pred)
    ...     loss = logits_loss(y_true, y_pred)
    >>> print(tape.gradient(loss, y_pred))  # the classic trap
    None
    >>> grad = kgrad.prediction_gradient(logits_loss, y_true, y_pred)
    >>> grad.shape
    TensorShape([1, 3])
    """
    if isinstance(loss_fn, keras.Model):
        return compiled_prediction_gradient(loss_fn, y_true, y_pred, sample_weight, argument=True)
    loss_fn = as_loss(loss_fn)
    y_copy = _plain_copy(y_pred)
    with tf.GradientTape() as tape:
        tape.watch(tf.nest.flatten(y_copy))
        if sample_weight is None:
            loss = loss_fn(y_true, y_copy)
        else:
            loss = loss_fn(y_true, y_copy, sample_weight=sample_weight)
        loss = tf.reduce_mean(loss)
    gradients = tape.gradient(
        loss, y_copy, unconnected_gradients=tf.UnconnectedGradients.ZERO
    )
    return gradients


def compiled_prediction_gradient(model, y_true, y_pred, sample_weight=None, argument=False):
    """dJ/dŷ of ``model``'s compiled loss; ``None`` if it has none (`compiled_loss_gradient`)."""
    return compiled_loss_gradient(prediction_gradient, model, y_true, y_pred, sample_weight, argument)
