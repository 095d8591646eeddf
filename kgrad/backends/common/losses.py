"""Loss functions as kgrad's dJ/dŷ evaluates them, whichever backend differentiates.

`kgrad.prediction_gradient` takes any loss ``model.compile`` accepts; these
turn it into a callable, and keep a compiled loss's own metrics from counting
the extra evaluation.

>>> import keras
>>> float(as_loss("mse")(keras.ops.ones((1, 2)), keras.ops.zeros((1, 2)))[0])
1.0
"""

import keras

from kgrad.backends.common import keras_internals


def as_loss(loss_fn):
    """``loss_fn`` as a callable; a name is looked up as ``model.compile`` does."""
    if isinstance(loss_fn, str):
        try:
            return keras.losses.get(loss_fn)
        except ValueError:
            raise ValueError(
                f"`loss_fn` names no Keras loss. Received: loss_fn={loss_fn!r}. Pass a name "
                "that model.compile accepts (e.g. 'sparse_categorical_crossentropy', 'mse'), "
                "a keras.losses.Loss, a function loss_fn(y_true, y_pred) or a compiled model."
            ) from None
    if not callable(loss_fn):
        raise TypeError(
            "`loss_fn` must be a loss name, a keras.losses.Loss, a callable "
            f"loss_fn(y_true, y_pred) or a compiled model. Received: loss_fn={loss_fn!r} of "
            f"type {type(loss_fn).__name__}. "
            "Example: kgrad.prediction_gradient('mse', y, y_pred)."
        )
    return loss_fn


def compiled_loss_gradient(prediction_gradient, model, y_true, y_pred, sample_weight=None, argument=True):
    """dJ/dŷ of ``model``'s compiled loss, by a backend's ``prediction_gradient``; ``None`` if it has none.

    With ``argument`` (the model was passed as `kgrad.prediction_gradient`'s
    ``loss_fn``), a model without a compiled loss raises instead.
    """
    compile_loss = keras_internals.compile_loss(model)
    if compile_loss is None:
        if not argument:
            return None
        raise ValueError(
            f"`loss_fn` is model '{model.name}', which has no compiled loss. Call "
            "model.compile(loss=...) first, or pass the loss itself as `loss_fn`."
        )

    def compiled_loss(y, y_copy, sample_weight=None):
        return compile_loss(y, y_copy, sample_weight)

    if not compile_loss.built:
        # Built here, not in the paused call: building adds the per-output
        # loss metrics to the list that the pause has swapped out, and the
        # call would then zip the losses with no metric and drop all but one.
        compile_loss.build(y_true, y_pred)
    with loss_metrics_paused(compile_loss):
        return prediction_gradient(compiled_loss, y_true, y_pred, sample_weight)


def loss_metrics_paused(compile_loss):
    """Keras' CompileLoss updates per-output loss metrics when called; the
    shadow evaluation for dJ/dŷ must not count twice in the logged metrics."""
    return keras_internals.compile_loss_metrics_paused(compile_loss)
