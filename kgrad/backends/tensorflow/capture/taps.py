"""Intercepting the outputs of layers and operations while a probe records.

Keras 3 has no layer hooks, but a layer's (or operation's) ``__call__`` always
ends in ``self.call(...)``. Replacing ``call`` on the *instance* while a probe
is open, and restoring it when the probe closes, intercepts outputs of layers in
Sequential, Functional and subclassed models alike, and of the non-layer
operations (``keras.ops.sin`` nodes) of Functional models.

The intercepted output is returned *unchanged* (same tensor object): Keras
attaches ``_keras_logits`` and ``_keras_mask`` to outputs, and copying the
tensor would silently change how the loss is computed.
"""

import contextlib
import inspect
import threading

import tensorflow as tf

from kgrad.backends.common.calls import replaced_calls

# Recorders currently open, innermost last. Process-wide on purpose: under
# `tf.distribute.MirroredStrategy` replica functions are traced on threads of
# their own, and they must still see the probe opened by the caller.
_ACTIVE_RECORDERS = []
_LOCK = threading.Lock()


def tap(name, x):
    """`kgrad.tap` on TensorFlow: hands ``x`` to the innermost open recorder, if any, and returns it.

    The open recorder is a `kgrad.ProbeTape`'s (also the one of a probing
    ``train_step``); ``x`` comes back unchanged, the same tensor object, so
    that what Keras attached to it (``_keras_logits``, ``_keras_mask``) stays.

    Example:

    >>> import keras, kgrad, tensorflow as tf
    >>> class Block(keras.Model):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.dense = keras.layers.Dense(2)
    ...     def call(self, x):
    ...         hidden = kgrad.tap("hidden", x * 2.0)
    ...         return self.dense(hidden)
    >>> model = Block()
    >>> with kgrad.ProbeTape(model) as tape:
    ...     loss = tf.reduce_sum(model(tf.ones((1, 3))))
    >>> _ = tape.gradient(loss, model.trainable_variables)
    >>> tape.probe.gradients["hidden"].shape
    TensorShape([1, 3])
    """
    recorder = active_recorder()
    if recorder is not None:
        recorder.record(name, x, source="tap")
    return x


def active_recorder():
    """Returns the innermost open recorder, or ``None``."""
    with _LOCK:
        return _ACTIVE_RECORDERS[-1] if _ACTIVE_RECORDERS else None


@contextlib.contextmanager
def recording(recorder):
    """Makes ``recorder`` the target of `tap` for the duration of the block."""
    with _LOCK:
        _ACTIVE_RECORDERS.append(recorder)
    try:
        yield recorder
    finally:
        with _LOCK:
            _ACTIVE_RECORDERS.remove(recorder)


def _layer_wrapper(original_call, recorder, name, keep):
    def call(*args, **kwargs):
        outputs = original_call(*args, **kwargs)
        if keep is None or keep():
            # The input is looked up only when asked for (per-example norms).
            inputs = (
                _first_argument(original_call, args, kwargs)
                if getattr(recorder, "record_inputs", False)
                else None
            )
            recorder.record(name, outputs, source="layer", inputs=inputs)
        return outputs

    return call


def _first_argument(original_call, args, kwargs):
    """The model's inputs: the first argument of its ``call``, as Keras defines them."""
    if args:
        return args[0]
    try:
        first = next(iter(inspect.signature(original_call).parameters))
    except (StopIteration, TypeError, ValueError):
        return None
    # `model(x=...)` reaches a subclassed `call(self, x)` as a keyword.
    return kwargs.get(first)


def _model_wrapper(original_call, recorder):
    def call(*args, **kwargs):
        # Inputs must be watched before the forward pass consumes them.
        recorder.watch_model_inputs(_first_argument(original_call, args, kwargs))
        outputs = original_call(*args, **kwargs)
        recorder.record_prediction(outputs)
        return outputs

    return call


@contextlib.contextmanager
def intercept(model, operations_by_name, recorder, keep=None):
    """Records inputs, outputs and chosen operations while the block runs.

    Each operation's ``call`` (and the model's own) is replaced on the
    instance and restored on exit, also when the block raises.

    Args:
        model: The probed model: its inputs and outputs are recorded.
        operations_by_name: ``dict`` from report name to operation.
        recorder: A `kgrad.backends.tensorflow.capture.recorder.Recorder`.
        keep: Optional ``keep(operation) -> bool``, asked each time an
            operation has run (so Keras has built it): only operations it
            keeps are recorded.
    """

    def wrapper_for(name, operation):
        condition = None if keep is None else (lambda: keep(operation))
        return lambda call: _layer_wrapper(call, recorder, name, condition)

    replacements = [(model, lambda call: _model_wrapper(call, recorder))]
    replacements += [(op, wrapper_for(name, op)) for name, op in operations_by_name.items()]
    with replaced_calls(replacements):
        yield


def float_leaves(structure):
    """The floating-point tensors of a nested structure, in flatten order."""
    leaves = []
    for leaf in tf.nest.flatten(structure):
        if isinstance(leaf, (tf.Tensor, tf.Variable)) and leaf.dtype.is_floating:
            leaves.append(leaf)
    return leaves
