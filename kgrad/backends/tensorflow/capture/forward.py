"""The forward half of Keras' ``train_step``, as the probing step runs it inside its tape."""

import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals


def build_if_needed(model, data):
    """Builds ``model`` symbolically if a layer is not built yet."""
    # Keras on TensorFlow builds a subclassed model inside the first trace of
    # the step, so its layers would have no weights yet when the ProbeTape
    # picks them (by default, the layers with weights), and the retrace that
    # follows variable creation would pick others. Build it first,
    # symbolically and without running anything, as Keras does under a
    # distribution strategy.
    if not all(layer.built for layer in keras_internals.flatten_layers(model)):
        keras_internals.symbolic_build(model, data)


def forward(model, x):
    if keras_internals.call_has_training_arg(model):
        return model(x, training=True)
    return model(x)


def forward_and_loss(model, x, y, sample_weight):
    """Keras' forward pass, loss, loss tracker and loss scaling."""
    y_pred = forward(model, x)
    loss = keras_internals.compute_loss(model, x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                        training=True)
    keras_internals.loss_tracker(model).update_state(
        keras_internals.unscale_loss_for_distribution(loss),
        sample_weight=tf.shape(next(i for i in tf.nest.flatten(x) if i is not None))[0],
    )
    if model.optimizer is not None:
        loss = model.optimizer.scale_loss(loss)
    return y_pred, loss
