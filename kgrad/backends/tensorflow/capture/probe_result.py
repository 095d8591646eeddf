"""`ProbeResult`: what one probed forward + backward pass of a `kgrad.ProbeTape` saw."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What one probed forward + backward pass saw.

    Attributes:
        activations: ``dict`` name -> output tensor of each captured layer,
            operation or `kgrad.tap`, in forward order.
        gradients: ``dict`` name -> dJ/d(activation), same keys and shapes.
            For a softmax/sigmoid output whose loss Keras computed from the
            logits (cross-entropy), the true dJ/dŷ when that loss was computed
            inside the tape's block; ``None`` (with a warning) when it was
            not, since the tape cannot see it: use `kgrad.prediction_gradient`.
        input: The model's input (same structure as passed), or ``None``.
        input_gradient: dJ/d(input), or ``None`` when inputs were not
            watched. It has the structure of ``input`` (a tensor, a list, a
            dict...) when every input is float; otherwise it is the list of
            the gradients of the float inputs, in ``tf.nest.flatten`` order.
        prediction: The model's output.
        layer_inputs: ``dict`` name -> input of each captured layer (its
            ``call``'s first argument), with ``ProbeTape(record_inputs=True)``.
        unconnected: Names of the activations the differentiated target does
            not depend on; their ``gradients`` are zeros (or ``None``, see
            ``gradients``).
        logits_gradients: ``dict`` name -> dJ/d(logits), for the captured
            softmax/sigmoid outputs whose cross-entropy Keras computed from
            the logits inside the tape's block: the gradient of the tensor
            the softmax or sigmoid was applied to.

    Example:

    >>> import keras, kgrad, tensorflow as tf
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    >>> with kgrad.ProbeTape(model, watch_inputs=True) as tape:
    ...     loss = tf.reduce_sum(model(tf.ones((3, 2))))
    >>> _ = tape.gradient(loss, model.trainable_variables)
    >>> probe = tape.probe  # a ProbeResult
    >>> list(probe.gradients), probe.gradients["out"].numpy().tolist()
    (['out'], [[1.0], [1.0], [1.0]])
    >>> probe.input_gradient.shape, probe.prediction.shape
    (TensorShape([3, 2]), TensorShape([3, 1]))
    """

    activations: dict
    gradients: dict
    input: object
    input_gradient: object
    prediction: object
    unconnected: frozenset = frozenset()
    layer_inputs: dict = dataclasses.field(default_factory=dict)
    logits_gradients: dict = dataclasses.field(default_factory=dict)
