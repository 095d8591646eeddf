"""Seeing the calls in which Keras computes a cross-entropy from the logits.

When ``y_pred`` comes out of a softmax or sigmoid, Keras' (sparse)
categorical and binary cross-entropies compute the loss from the logits behind
it (``_keras_logits``, or the op's input in a graph), so the loss does not
depend on ``y_pred`` on the tape and ``tape.gradient(loss, y_pred)`` is
``None``. Every Keras entry point (``Loss`` objects, the compiled loss,
``keras.losses.*`` and ``keras.ops.*`` functions) ends in the TensorFlow
backend's three functions; while a `kgrad.ProbeTape` records, those are seen
here: for each call that took the shortcut, the tape gets the output tensor,
the targets, the loss value and a way to compute the same loss from the
probabilities. `kgrad.ProbeTape.gradient` then chains dJ/d(loss value) (from
its own backward pass) through that plain loss to give the true dJ/dŷ.

Outside a recording, the wrappers only look up an empty list: the functions
cost what they cost.
"""

import contextlib
import dataclasses
import functools
import threading

import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals

# The op type Keras looks for in a graph, per function.
_OP_TYPES = {
    "categorical_crossentropy": "Softmax",
    "sparse_categorical_crossentropy": "Softmax",
    "binary_crossentropy": "Sigmoid",
}
# Open recordings, innermost last: process-wide, like `kgrad.backends.tensorflow.capture.taps`, because
# replica functions of a tf.distribute strategy are traced on other threads.
_RECORDINGS = []
_LOCK = threading.Lock()
_ORIGINALS = {}


@dataclasses.dataclass(frozen=True)
class ShortcutCall:
    """One cross-entropy that Keras computed from the logits behind ``output``.

    Attributes:
        output: The softmax/sigmoid output passed as ``y_pred``.
        value: The loss tensor the call returned (per example or element).
        plain_loss: ``fn(output) -> value``: the same loss computed from the
            probabilities themselves (no shortcut), differentiable in ``output``.
        logits: The logits the loss was computed from (``output``'s
            ``_keras_logits``, or its Softmax/Sigmoid op's input).
    """

    output: object
    value: object
    plain_loss: object
    logits: object = None


class _Recording:
    def __init__(self, tape):
        self.tape = tape
        self.calls = []
        self.graph = _current_graph()


def _current_graph():
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


@contextlib.contextmanager
def recording(tape):
    """Records the shortcut calls made while open; yields the list they go to.

    Args:
        tape: The ``tf.GradientTape`` that must watch each call's loss value
            (so that it can be a source of the tape's gradient).
    """
    _install_wrappers()
    entry = _Recording(tape)
    with _LOCK:
        _RECORDINGS.append(entry)
    try:
        yield entry.calls
    finally:
        with _LOCK:
            _RECORDINGS.remove(entry)


def _recording_for_this_graph():
    graph = _current_graph()
    with _LOCK:
        for entry in reversed(_RECORDINGS):
            if entry.graph is graph:
                return entry
    return None


def _shortcut_logits(name, output, from_logits):
    """The logits Keras computes the loss from instead of ``output``, or ``None``."""
    if from_logits or not tf.is_tensor(output):
        return None
    logits = keras_internals.logits_behind(output, _OP_TYPES[name], name)
    return None if logits is output else logits


def _wrap(name, original):
    @functools.wraps(original)
    def cross_entropy(target, output, from_logits=False, *args, **kwargs):
        value = original(target, output, from_logits, *args, **kwargs)
        logits = _shortcut_logits(name, output, from_logits) if _RECORDINGS else None
        if logits is not None:
            entry = _recording_for_this_graph()
            if entry is not None:
                entry.tape.watch(value)
                entry.calls.append(ShortcutCall(
                    output=output,
                    value=value,
                    plain_loss=lambda probabilities: original(
                        target, probabilities, False, *args, **kwargs
                    ),
                    logits=logits,
                ))
        return value

    return cross_entropy  # functools.wraps keeps Keras' function as its __wrapped__


def _install_wrappers():
    with _LOCK:
        if _ORIGINALS:
            return
        for name in _OP_TYPES:
            original = getattr(keras_internals.tensorflow_nn, name)
            _ORIGINALS[name] = original
            setattr(keras_internals.tensorflow_nn, name, _wrap(name, original))


def gradient_through_probabilities(call, value_gradient):
    """dJ/d(output) of a shortcut call, given dJ/d(its loss value).

    The loss is evaluated again on a plain copy of the probabilities
    (``tf.identity`` has neither ``_keras_logits`` nor the Softmax op type),
    and its gradient is chained with ``value_gradient``: every reduction,
    weighting and scaling between the call and J is in ``value_gradient``.
    """
    copy = tf.identity(call.output)
    with tf.GradientTape() as tape:
        tape.watch(copy)
        value = call.plain_loss(copy)
    gradient = tape.gradient(
        value, copy, output_gradients=tf.cast(value_gradient, value.dtype),
        unconnected_gradients=tf.UnconnectedGradients.ZERO,
    )
    return tf.cast(gradient, call.output.dtype)


def has_logits_shortcut(tensor):
    """Whether Keras' cross-entropies would compute a loss of ``tensor`` from its logits."""
    if not tf.is_tensor(tensor) or not tensor.dtype.is_floating:
        return False
    if keras_internals.keras_logits(tensor) is not None:
        return True
    op = getattr(tensor, "op", None) if not isinstance(tensor, tf.__internal__.EagerTensor) else None
    return op is not None and op.type in ("Softmax", "Sigmoid")
