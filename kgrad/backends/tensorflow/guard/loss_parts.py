"""The terms Keras adds up into a model's training loss, named, for the replay.

Keras' ``compute_loss`` is the compiled loss plus ``model.losses``: each
layer's ``add_loss`` terms of the call just made and each trainable weight's
regularization loss. When the total is the first non-finite value of a
replayed step, "born at 'loss'" would blame the data loss for an ``L2(1e38)``
kernel regularizer or a ``sqrt`` in a layer's ``add_loss``; `loss_parts`
lists the terms so that `kgrad.backends.tensorflow.guard.locate.locate` can name the one that is not
finite.
"""

from kgrad.backends.tensorflow import keras_internals


def loss_parts(model, y, y_pred, sample_weight):
    """The terms of ``model``'s training loss, in the order they arise.

    Call it eagerly, right after the forward pass whose ``add_loss`` terms it
    should see (Keras clears them at the start of each call of the model).

    Args:
        model: A compiled `keras.Model`.
        y, y_pred, sample_weight: The batch's targets, the model's
            predictions on it and its sample weights.

    Returns:
        A list of ``dict``: ``name``, ``type``, ``path`` (as the replay's
        ``born_*`` fields name them), ``value`` (the term) and ``inputs``
        (what its finite input range is read from, or ``None``). First each
        layer's ``add_loss`` terms, in the order of the layers, then the
        compiled loss (``"loss"``), then the weights' regularization losses.

    Example:

    >>> import keras, numpy as np
    >>> from kgrad.backends.tensorflow.guard.loss_parts import loss_parts
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="big",
    ...     kernel_initializer="ones", kernel_regularizer=keras.regularizers.L2(1e38))])
    >>> model.compile("sgd", "mse")
    >>> x, y = np.ones((1, 4), "float32"), np.zeros((1, 1), "float32")  # 1e38 * 4 overflows
    >>> parts = loss_parts(model, y, model(x), None)
    >>> [(part["name"], part["type"], bool(np.isfinite(part["value"]))) for part in parts]
    [('loss', 'loss', True), ('big/kernel', 'L2 regularization loss', False)]
    """
    from kgrad.plan.operations import tappable_operations

    paths = {}  # id(layer) -> its path as kgrad names it ("outer/inner", no model name)
    for path, operation in tappable_operations(model).items():
        if len(path) >= len(paths.get(id(operation), "")):
            paths[id(operation)] = path
    parts = []
    for layer in keras_internals.flatten_layers(model):
        kind = f"add_loss of {type(layer).__name__}"
        for index, term in enumerate(keras_internals.own_losses(layer)):
            name = layer.name if index == 0 else f"{layer.name}#{index + 1}"
            parts.append(_part(name, kind, paths.get(id(layer), layer.name), term, None))
    compile_loss = keras_internals.compile_loss(model)
    if compile_loss is not None:
        value = compile_loss(y, y_pred, sample_weight)
        if value is not None:
            parts.append(_part("loss", "loss", "loss", value, y_pred))
    for weight in model.trainable_weights:
        if weight.regularizer is not None:
            kind = f"{type(weight.regularizer).__name__} regularization loss"
            path = weight.path.removeprefix(f"{model.name}/")  # as the guard names weights
            parts.append(_part(path, kind, path, weight.regularizer(weight), weight))
    return parts


def _part(name, kind, path, value, inputs):
    return {"name": name, "type": kind, "path": path, "value": value, "inputs": inputs}
