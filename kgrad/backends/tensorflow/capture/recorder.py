"""What a probe saw during one forward pass: inputs, activations, prediction.

A `Recorder` is filled by the intercepted ``call``s (see `kgrad.backends.tensorflow.capture.taps`) and by
`kgrad.tap`. It watches every captured float tensor on the gradient tape, so
that the backward pass can return dJ/d(tensor) for it.

Only tensors of the graph the tape was opened in are captured. Inside
``tf.function``, the body of a loop (an RNN cell under ``tf.while_loop``) or of
``tf.map_fn`` is traced into a graph of its own: a tensor from there cannot be
a source of the tape's gradient (the tape would silently return zeros), so it
is counted as unreachable instead.
"""

import warnings

import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.tensorflow.capture import taps


class Recorder:
    """Collects named tensors from one forward pass of a model.

    Args:
        tape: The ``tf.GradientTape`` that must watch the captured tensors.
        model: The model whose own call provides the input and prediction.
        watch_inputs: Whether the model's float inputs are watched (dJ/dx).
        integer_inputs: ``"raise"`` to reject integer inputs when
            ``watch_inputs`` is set, ``"skip"`` to watch only float inputs,
            ``"warn"`` to watch only float inputs and say so (a probe in ``fit``
            that captures ``input_gradient``).
        record_inputs: Also keep each captured layer's input (the first
            argument of its ``call``) in ``layer_inputs``, under the same name
            as its activation, for the per-example gradient norms of
            `kgrad.instruments` (they need the input ``a`` beside dJ/d(output)).
            Off by default (unless ``tape._record_inputs`` is true): then nothing
            is kept. The inputs are not watched: no gradient is asked for them.
    """

    def __init__(self, tape, model, watch_inputs, integer_inputs="raise", record_inputs=False):
        self._tape = tape
        self._model = model
        self._watch_inputs = watch_inputs
        self._integer_inputs = integer_inputs
        # A ProbeTape asks for inputs with its own `_record_inputs` (so that the
        # recorder it creates anew on each `__enter__` keeps the setting).
        self.record_inputs = record_inputs or bool(getattr(tape, "_record_inputs", False))
        self.activations = {}
        self.layer_inputs = {}
        self.non_float = {}
        self.calls_per_name = {}
        self.unreachable = set()
        self.model_called = False
        self.inputs = None
        self.prediction = None
        self._graph = _current_graph()

    def _unique_name(self, name):
        count = self.calls_per_name.get(name, 0) + 1
        self.calls_per_name[name] = count
        return name if count == 1 else f"{name}#{count}"

    def record(self, name, outputs, source, inputs=None):
        """Watches and stores the float tensors of ``outputs`` under ``name``.

        ``inputs`` (the layer's input, given only when ``record_inputs`` is
        set) is kept in ``layer_inputs`` under the name of the call (``name``,
        ``name#2``...), whatever its dtype (an Embedding's ids are integers).
        """
        if keras_internals.in_symbolic_scope():
            # Keras traces call() in a scratch graph to infer shapes when it
            # builds a subclassed model; those tensors never reach the loss.
            return
        if _current_graph() is not self._graph:
            self.unreachable.add(name)
            return
        name = self._unique_name(name)
        leaves = tf.nest.flatten(outputs)
        floats = taps.float_leaves(outputs)
        if not floats:
            self.non_float[name] = [getattr(leaf, "dtype", type(leaf)) for leaf in leaves]
            return
        for index, tensor in enumerate(floats):
            key = name if len(floats) == 1 else f"{name}/{index}"
            self._tape.watch(tensor)
            self.activations[key] = tensor
        if self.record_inputs and inputs is not None:
            self.layer_inputs[name] = inputs

    def watch_model_inputs(self, inputs):
        """Called with the model's inputs before its forward pass runs."""
        if self.model_called or keras_internals.in_symbolic_scope() or _current_graph() is not self._graph:
            return
        self.model_called = True
        self.inputs = inputs
        if not self._watch_inputs:
            return
        integer_inputs = [
            leaf
            for leaf in tf.nest.flatten(inputs)
            if isinstance(leaf, tf.Tensor) and not leaf.dtype.is_floating
        ]
        if integer_inputs and self._integer_inputs == "raise":
            raise ValueError(
                "`watch_inputs=True` asks for dJ/d(input), but model "
                f"'{self._model.name}' received non-float inputs. Received: "
                f"input dtypes {[leaf.dtype.name for leaf in integer_inputs]}. "
                "Integers (e.g. token ids) have no gradient. Pass "
                "watch_inputs=False and capture the first float tensor instead, "
                "e.g. the output of the embedding layer: "
                f"kgrad.ProbeTape(model, layers=[{_embedding_hint(self._model)}])."
            )
        if integer_inputs and self._integer_inputs == "warn":
            floats = len(taps.float_leaves(inputs))
            warnings.warn(
                f"kgrad writes dJ/d(input) only for float inputs: model '{self._model.name}' "
                f"received {len(integer_inputs)} input(s) of dtype "
                f"{sorted({leaf.dtype.name for leaf in integer_inputs})}, which have no gradient, "
                f"so no input_grad_* tag is written for them ({floats} float input(s) get one). "
                "Read the gradient of the first float tensor they lead to in "
                f"grad_norm/<its layer>, e.g. of {_embedding_hint(self._model)}; leave "
                "'input_gradient' out of capture= to silence this.",
                stacklevel=2,
            )
        for tensor in taps.float_leaves(inputs):
            self._tape.watch(tensor)

    def record_prediction(self, outputs):
        """Called with the model's outputs; the first call's are kept."""
        if self.prediction is None and not keras_internals.in_symbolic_scope():
            if _current_graph() is self._graph:
                self.prediction = outputs
                for tensor in taps.float_leaves(outputs):
                    self._tape.watch(tensor)  # for ProbeResult.prediction_gradient

    def watched_inputs(self):
        """The float input tensors that were watched, in flatten order."""
        if not self._watch_inputs or self.inputs is None:
            return []
        return taps.float_leaves(self.inputs)


def _current_graph():
    """The graph being traced, or ``None`` when executing eagerly."""
    if tf.executing_eagerly():
        return None
    return tf.compat.v1.get_default_graph()


def _embedding_hint(model):
    import keras

    names = [
        layer.name
        for layer in keras_internals.flatten_layers(model, include_self=False)
        if isinstance(layer, keras.layers.Embedding)
    ]
    return ", ".join(repr(name) for name in names) or "'<first layer with a float output>'"
