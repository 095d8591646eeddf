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
    """Returns dJ/dŷ, the gradient of a loss with respect to the prediction.

    When a model ends in softmax (or sigmoid) and the loss is (sparse)
    categorical / binary cross-entropy, Keras computes the loss from the logits
    stored on ``y_pred``, so ``tape.gradient(loss, y_pred)`` is ``None``. This
    function evaluates ``loss_fn`` again on a plain copy of ``y_pred`` in a tape
    of its own: the result is the gradient of the same loss as a function of the
    prediction, and the training loss and weight gradients are left untouched.

    The reduction is the loss function's own. With Keras' default
    ``"sum_over_batch_size"``, J is the mean over the batch (also with
    ``sample_weight``: the weighted sum divided by the batch size), so each
    row of dJ/dŷ carries a factor 1/batch_size: multiply by the batch size
    for per-example gradients. A ``loss_fn`` that returns a per-example
    (non-scalar) loss is averaged over all its elements, which is the same
    convention. The Keras mask of ``y_pred`` is kept, so masked time steps
    get zero gradient, as in the training loss.

    Args:
        loss_fn: Any loss ``model.compile`` accepts: a name
            (``"sparse_categorical_crossentropy"``), a ``keras.losses.Loss``,
            a function ``loss_fn(y_true, y_pred)`` (or with ``sample_weight``)
            returning a scalar or per-example losses, or a compiled model
            (its compiled loss, with every output's loss and weight).
        y_true: Targets.
        y_pred: The model's prediction (a tensor or nested structure).
        sample_weight: Optional per-example weights, passed to ``loss_fn``.

    Returns:
        dJ/dŷ with the structure and shapes of ``y_pred``.

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
