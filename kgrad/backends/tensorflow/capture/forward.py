"""The forward half of Keras' ``train_step``, as the probing step runs it inside its tape."""

import tensorflow as tf
from keras.src.losses import loss as keras_loss


def build_if_needed(model, data):
    """Builds ``model`` symbolically if a layer is not built yet."""
    # Keras on TensorFlow builds a subclassed model inside the first trace of
    # the step, so its layers would have no weights yet when the ProbeTape
    # picks them (by default, the layers with weights), and the retrace that
    # follows variable creation would pick others. Build it first,
    # symbolically and without running anything, as Keras does under a
    # distribution strategy.
    if not all(layer.built for layer in model._flatten_layers()):
        model._symbolic_build(data_batch=data)


def _forward(model, x):
    if model._call_has_training_arg:
        return model(x, training=True)
    return model(x)


def forward_and_loss(model, x, y, sample_weight):
    """Keras' forward pass, loss, loss tracker and loss scaling."""
    y_pred = _forward(model, x)
    loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
    model._loss_tracker.update_state(
        keras_loss.unscale_loss_for_distribution(loss),
        sample_weight=tf.shape(next(i for i in tf.nest.flatten(x) if i is not None))[0],
    )
    if model.optimizer is not None:
        loss = model.optimizer.scale_loss(loss)
    return y_pred, loss
