"""`kgrad.tap` and `kgrad.prediction_gradient`: documented once, the work each backend's own.

``help(kgrad.tap)`` reads the same on every backend. Each function here
checks what is backend-free and calls the function of the backend Keras runs
on (`kgrad.backends.current()`, `kgrad.backends.interface.Backend`), whose own
docstring says what it does differently there.
"""

from kgrad import backends
from kgrad.plan.options import check_tap_name


def tap(name, x):
    """Marks a tensor inside a model's ``call()`` for capture by a probe.

    Returns ``x``. When no probe is recording, ``tap`` does nothing else, so it
    can stay in a model permanently at no cost. What records:

    - on TensorFlow, a `kgrad.ProbeTape` and the probing ``train_step`` of
      `kgrad.GradientProbe` or `kgrad.ProbingModel`; inside ``tf.function``, a
      tap in the body of a loop (``tf.while_loop``, ``tf.map_fn``) is not
      captured, as the tape cannot differentiate with respect to its tensors;
    - on JAX, the probed steps of `kgrad.GradientProbe` (Keras' own
      ``train_step``) and of a model's own ``train_step`` that differentiates
      with `kgrad.value_and_grad`.

    Args:
        name: The name the tensor is reported under (``str``). A name tapped
            several times in one forward pass is reported as ``name``,
            ``name#2``, ``name#3``...
        x: A float tensor (or a nested structure of tensors).

    Returns:
        ``x``: the tensor itself, or inside a probed JAX step the same values
        through an identity whose backward pass takes dJ/dx's statistics.

    Raises:
        TypeError: If ``name`` is not a non-empty string.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> doubled = keras.layers.Lambda(lambda x: kgrad.tap("doubled", x * 2.0))
    >>> model = keras.Sequential([keras.Input((3,)), doubled, keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> probe = kgrad.GradientProbe(every_n_steps=1)
    >>> _ = model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0, callbacks=[probe])
    >>> "grad_norm/doubled" in probe.latest.scalars
    True
    """
    check_tap_name(name)
    return backends.current().tap(name, x)


def prediction_gradient(loss_fn, y_true, y_pred, sample_weight=None):
    """Returns dJ/dŷ, the gradient of a loss with respect to the prediction.

    The loss is evaluated again, as a function of ``y_pred``, and
    differentiated there: the training loss and the weight gradients are left
    untouched. On TensorFlow this is the way to dJ/dŷ when a model ends in
    softmax (or sigmoid) and the loss is a (sparse) categorical or binary
    cross-entropy: Keras computes that loss from the logits stored on
    ``y_pred``, so ``tape.gradient(loss, y_pred)`` is ``None``.

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

    Raises:
        ValueError: If ``loss_fn`` names no Keras loss, or is a model with no
            compiled loss.
        TypeError: If ``loss_fn`` is none of the above.

    Example:

    >>> import keras, kgrad
    >>> y_pred = keras.ops.convert_to_tensor([[0.2, 0.8]])
    >>> gradient = kgrad.prediction_gradient("mse", keras.ops.convert_to_tensor([[0.0, 1.0]]), y_pred)
    >>> [round(float(value), 4) for value in gradient[0]]  # 2 (ŷ - y) / 2 outputs
    [0.2, -0.2]
    """
    return backends.current().prediction_gradient(loss_fn, y_true, y_pred, sample_weight)
