"""`ProbeTape`: a `tf.GradientTape` that also sees inside the model."""

import contextlib

import tensorflow as tf

from kgrad.backends.tensorflow.capture import active_collection, attention_calls
from kgrad.backends.tensorflow.capture import logits_shortcut, tape_checks, taps
from kgrad.plan import selection
from kgrad.backends.tensorflow.capture import probe_result
from kgrad.backends.tensorflow.capture.probe_result import ProbeResult
from kgrad.backends.tensorflow.capture.recorder import Recorder


class ProbeTape(tf.GradientTape):
    """A `tf.GradientTape` that records the outputs of a model's layers.

    Inside the ``with`` block, the outputs of the chosen layers and operations
    of ``model`` (also of nested models, and tensors marked with `kgrad.tap`)
    are watched and available as ``tape.activations[name]`` right after the
    forward pass; they can be passed as sources to ``tape.gradient``. After
    ``tape.gradient(loss, sources)``, ``tape.probe`` holds the activations,
    dJ/d(activation), the input and dJ/d(input) and the prediction, all from
    the *same* backward pass that computed the requested gradients.

    Works eagerly, in ``tf.function`` and in ``tf.function(jit_compile=True)``.
    Layers are restored when the block exits, also on error. TensorFlow only:
    on Keras' JAX backend a tape has no meaning (a jitted step differentiates
    with ``jax.value_and_grad``), and ``kgrad.ProbeTape`` raises, saying to
    pass `kgrad.GradientProbe` to ``fit``.

    Args:
        model: The ``keras.Model`` to look inside.
        layers: Which layers / operations to capture: ``None`` (every leaf
            layer with weights; a recurrent layer counts as a leaf), ``"all"``,
            a list of names or layer objects, or a predicate
            ``fn(layer) -> bool``. The cell of a recurrent layer is never
            captured (it runs once per time step; the layer's output is).
            A layer of a nested model is named by its path
            ``"outer/inner"`` or by its plain name when that is unique; it
            is reported under its plain name when unique, its path
            otherwise. A layer called several times in one pass (a shared
            layer) is captured per call: ``name``, ``name#2``, ... A layer
            with several float outputs is reported as ``name/0``,
            ``name/1``, ... Tensors marked with `kgrad.tap` are always
            captured.
        watch_inputs: Also compute dJ/d(input) (of the first argument of the
            model's ``call``). Integer inputs raise a ``ValueError``.
        persistent: As for ``tf.GradientTape``. A non-persistent tape allows
            exactly one ``gradient`` call.
        watch_accessed_variables: As for ``tf.GradientTape``.
        name: The name a `kgrad.GradientProbe` logs this tape under, in a
            model's own ``train_step`` (default: the model's name).
        record_inputs: Also keep each captured layer's input, in
            ``tape.probe.layer_inputs`` (for per-example gradient norms).

    Example:

    >>> import keras, kgrad, tensorflow as tf
    >>> model = keras.Sequential([keras.Input((3,)),
    ...     keras.layers.Dense(4, name="hidden"), keras.layers.Dense(1, name="out")])
    >>> x = tf.ones((2, 3))
    >>> with kgrad.ProbeTape(model, layers=["hidden"], watch_inputs=True) as tape:
    ...     loss = tf.reduce_mean(model(x) ** 2)
    >>> weight_grads = tape.gradient(loss, model.trainable_variables)
    >>> tape.probe.gradients["hidden"].shape, tape.probe.input_gradient.shape
    (TensorShape([2, 4]), TensorShape([2, 3]))
    """

    def __init__(
        self,
        model,
        layers=None,
        watch_inputs=False,
        persistent=False,
        watch_accessed_variables=True,
        name=None,
        record_inputs=False,
        *,
        _integer_inputs="raise",
        _record_attention=False,
    ):
        super().__init__(
            persistent=persistent, watch_accessed_variables=watch_accessed_variables
        )
        if not hasattr(model, "call") or not hasattr(model, "layers"):
            raise TypeError(
                "`model` must be a keras.Model. Received: "
                f"model={model!r} of type {type(model).__name__}. Pass the model "
                "you call inside the block, e.g. kgrad.ProbeTape(model)."
            )
        if not isinstance(watch_inputs, bool):
            raise TypeError(
                "`watch_inputs` must be True or False (a bool). Received: "
                f"watch_inputs={watch_inputs!r} of type {type(watch_inputs).__name__}."
            )
        if name is not None and (not isinstance(name, str) or not name or "/" in name):
            raise ValueError(
                "`name` must be a non-empty string without '/' (it names a TensorBoard run). "
                f"Received: name={name!r}. Example: kgrad.ProbeTape(self.generator, name='generator')."
            )
        if not isinstance(record_inputs, bool):
            raise TypeError(
                f"`record_inputs` must be True or False. Received: record_inputs={record_inputs!r}."
            )
        self._record_inputs = record_inputs
        self._record_attention = _record_attention  # q and k of attention layers (instrument)
        self._attention = None
        self._model = model
        self._name = name or model.name
        self._layers = layers
        self._operations, self._keep = selection.resolve_selection(model, layers)
        self._explicit_layers = self._keep is None
        self._recorder = Recorder(self, model, watch_inputs, _integer_inputs)
        self._open_contexts = None
        self._probe = None
        self._replaying = False
        self._shortcut_calls = []

    def __enter__(self):
        watch_inputs, integer_inputs = self._recorder._watch_inputs, self._recorder._integer_inputs
        self._probe = self._attention = None
        self._replaying = False
        collection = active_collection.active_collection()
        if collection is not None:
            # A probed train_step traces both backward passes (probed, plain) in a tf.cond.
            self._persistent = True
            self._record_inputs = self._record_inputs or collection.records_layer_inputs
            if collection.captures_everything:
                # The guard's replay of a tripped step: every operation, its
                # inputs and the model's float inputs, whatever was asked.
                self._replaying = True
                self._operations, self._keep = selection.resolve_selection(self._model, "all")
                watch_inputs, integer_inputs = True, "skip"
        self._recorder = Recorder(self, self._model, watch_inputs, integer_inputs)
        stack = contextlib.ExitStack()
        stack.enter_context(
            taps.intercept(self._model, self._operations, self._recorder, self._keep)
        )
        stack.enter_context(taps.recording(self._recorder))
        self._shortcut_calls = stack.enter_context(logits_shortcut.recording(self))
        if self._record_attention or getattr(collection, "records_attention", False):
            self._attention = stack.enter_context(attention_calls.intercept(self._model))
        self._open_contexts = stack
        try:
            return super().__enter__()
        except BaseException:
            stack.close()
            raise

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            self._open_contexts.close()
        finally:
            self._open_contexts = None
            super().__exit__(exc_type, exc_value, traceback)

    @property
    def model(self):
        """The model this tape looks inside."""
        return self._model

    @property
    def name(self):
        """The name a `kgrad.GradientProbe` logs this tape under."""
        return self._name

    @property
    def activations(self):
        """``dict`` name -> captured tensor, filled during the forward pass."""
        return dict(self._recorder.activations)

    @property
    def probe(self):
        """The `ProbeResult` of the latest ``gradient`` call."""
        if self._probe is None:
            raise RuntimeError(
                "`tape.probe` is only available after `tape.gradient(...)` has "
                "been called: the gradients it holds come from that backward "
                "pass. Call `tape.gradient(loss, model.trainable_variables)` first."
            )
        return self._probe

    def _check_forward_pass(self):
        if self._replaying:
            return  # the traced step passed these checks; the replay widened the capture
        tape_checks.check_forward_pass(
            self._recorder, self._model, self._layers, self._explicit_layers, self._operations
        )

    # Not converted by AutoGraph (in a user's tf.function): it would mangle the `super()` calls.
    @tf.autograph.experimental.do_not_convert
    def gradient(
        self,
        target,
        sources,
        output_gradients=None,
        unconnected_gradients=tf.UnconnectedGradients.NONE,
    ):
        """Like `tf.GradientTape.gradient`; also fills ``tape.probe``.

        The requested ``sources``, the captured activations and the watched
        inputs are differentiated in one single backward pass. Activations
        and inputs the target does not depend on get zero gradients. Inside
        a ``train_step`` that a `kgrad.GradientProbe` probes, the probe
        decides which steps take the full pass (the others take the plain one).
        """
        self._check_forward_pass()
        collection = active_collection.active_collection()
        if collection is not None:
            return collection.gradient(self, target, sources, output_gradients, unconnected_gradients)
        return self.probed_gradient(target, sources, output_gradients, unconnected_gradients)

    def plain_gradient(self, target, sources, output_gradients=None,
                       unconnected_gradients=tf.UnconnectedGradients.NONE):
        """Exactly `tf.GradientTape.gradient`: no capture, ``tape.probe`` unchanged."""
        return super().gradient(
            target, sources, output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients,
        )

    def probed_gradient(self, target, sources, output_gradients=None,
                        unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The single backward pass over ``sources`` and the captured tensors."""
        flat_sources = tf.nest.flatten(sources)
        names = list(self._recorder.activations)
        captured = [self._recorder.activations[name] for name in names]
        inputs = self._recorder.watched_inputs()
        position = {id(tensor): index for index, tensor in enumerate(captured)}
        # dJ/dŷ from the same pass, also when the output layer is not captured (the recorder watched it).
        predictions = taps.float_leaves(self._recorder.prediction)
        predicted = {id(tensor): index for index, tensor in enumerate(predictions)}
        reached = position.keys() | predicted.keys()  # outputs whose shortcut counts: captured, or ŷ
        shortcuts = [call for call in self._shortcut_calls if id(call.output) in reached]
        # dJ/d(logits) of each captured output whose cross-entropy took the shortcut, from the pass
        # itself: not chained back through the probabilities (a softmax the plain step never computes).
        logits = {}
        for call in shortcuts:
            if id(call.output) in position:
                logits.setdefault(position[id(call.output)], call.logits)
        logits_indices = sorted(logits)
        every_gradient = super().gradient(
            target,
            flat_sources + captured + inputs + [call.value for call in shortcuts]
            + [logits[index] for index in logits_indices] + predictions,
            output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients,
        )
        split = len(every_gradient) - len(predictions)
        every_gradient, prediction_part = every_gradient[:split], list(every_gradient[split:])
        user_part = every_gradient[: len(flat_sources)]
        probe_part = every_gradient[len(flat_sources) : len(flat_sources) + len(captured) + len(inputs)]
        shortcut_part = every_gradient[len(flat_sources) + len(captured) + len(inputs) :]
        value_gradients, logits_part = shortcut_part[: len(shortcuts)], shortcut_part[len(shortcuts) :]
        activation_gradients = probe_result.zeros_for_none(probe_part[: len(captured)], captured)
        hidden = set()  # activations whose dJ/d(activation) the tape cannot see
        for index, tensor in enumerate(captured):
            if probe_part[index] is None and logits_shortcut.has_logits_shortcut(tensor):
                hidden.add(index)
        for call, value_gradient in zip(shortcuts, value_gradients):
            if value_gradient is None:
                continue  # that loss is not part of the target
            through = logits_shortcut.gradient_through_probabilities(call, value_gradient)
            if id(call.output) in position:
                index = position[id(call.output)]
                activation_gradients[index] += through
                hidden.discard(index)
            if id(call.output) in predicted:  # dJ/dŷ: the shortcut's part, plus any other path's
                index = predicted[id(call.output)]
                direct = prediction_part[index]
                prediction_part[index] = through if direct is None else direct + through
        for index in sorted(hidden):
            activation_gradients[index] = None
            tape_checks.warn_hidden_gradient(names[index])
        for tensor, gradient in zip(predictions, prediction_part):
            if gradient is None and logits_shortcut.has_logits_shortcut(tensor):
                tape_checks.warn_hidden_gradient(self._model.name, "tape.probe.prediction_gradient")
        logits_gradients = {
            names[index]: gradient
            for index, gradient in zip(logits_indices, logits_part)
            if gradient is not None
        }
        input_gradients = probe_result.zeros_for_none(probe_part[len(captured) :], inputs)
        self._probe = ProbeResult(
            activations=dict(zip(names, captured)),
            gradients=dict(zip(names, activation_gradients)),
            input=self._recorder.inputs,
            input_gradient=probe_result.like_inputs(self._recorder.inputs, input_gradients)
            if inputs
            else None,
            prediction=self._recorder.prediction,
            prediction_gradient=probe_result.packed_like(self._recorder.prediction, prediction_part),
            layer_inputs=dict(self._recorder.layer_inputs),
            unconnected=frozenset(
                name for name, gradient in zip(names, probe_part) if gradient is None
            ),
            logits_gradients=logits_gradients,
            attention=self._attention,
        )
        return tf.nest.pack_sequence_as(sources, user_part)
