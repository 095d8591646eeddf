"""`ProbeResult`: what one probed forward + backward pass of a `kgrad.ProbeTape` saw."""

import dataclasses

import tensorflow as tf


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
        prediction_gradient: dJ/dŷ from the same backward pass, like
            ``prediction``, also for a softmax/sigmoid output whose Keras
            cross-entropy was computed inside the block (as ``gradients``);
            ``None`` when the target does not reach it (with a warning when
            such a loss was computed outside the block) or an output is not
            float.
        layer_inputs: ``dict`` name -> input of each captured layer (its
            ``call``'s first argument), with ``ProbeTape(record_inputs=True)``.
        unconnected: Names of the activations the differentiated target does
            not depend on; their ``gradients`` are zeros (or ``None``, see
            ``gradients``).
        logits_gradients: ``dict`` name -> dJ/d(logits), for the captured
            softmax/sigmoid outputs whose cross-entropy Keras computed from
            the logits inside the tape's block: the gradient of the tensor
            the softmax or sigmoid was applied to.
        attention: The attention layers' projected q and k
            (`kgrad.backends.common.attention_calls.AttentionCapture`),
            for ``instruments=["attention"]``, or ``None``.

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
    prediction_gradient: object = None
    attention: object = None


def zeros_for_none(gradients, tensors):
    return [
        tf.zeros_like(tensor) if gradient is None else gradient
        for gradient, tensor in zip(gradients, tensors)
    ]


def like_inputs(inputs, gradients):
    """Packs input gradients like the inputs, when every input is float."""
    if len(gradients) == len(tf.nest.flatten(inputs)):
        return tf.nest.pack_sequence_as(inputs, gradients)
    # Integer inputs (skipped) have no gradient: no place to pack a None in.
    return gradients[0] if len(gradients) == 1 else list(gradients)


def packed_like(structure, gradients):
    """``gradients`` of the float leaves of ``structure``, packed like it; ``None`` if one is missing."""
    if structure is None or None in gradients or len(gradients) != len(tf.nest.flatten(structure)):
        return None
    return tf.nest.pack_sequence_as(structure, gradients)
