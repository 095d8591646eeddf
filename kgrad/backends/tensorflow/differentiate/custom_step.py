"""Probing a model's own ``train_step``: each `kgrad.ProbeTape` in it reports to the probe.

A GAN, a VAE or any model with its own ``train_step`` differentiates with
tapes of its own, often several per step, over sub-models
(``self.generator``, ``self.discriminator``), each applied by its own
optimizer. While a `kgrad.GradientProbe` trains such a model, kgrad runs
the model's ``train_step`` inside a `TapeCollection`: every ``ProbeTape``
opened in it hands its ``gradient`` call to the collection, which, on probed
steps, takes the one backward pass over the weights *and* the captured
tensors (`kgrad.ProbeTape.probed_gradient`) and summarizes it with a
`kgrad.backends.tensorflow.summarize.pipeline.ProbePipeline` of that tape; on other steps the tape takes the
plain pass. The gradients the user's step receives, and applies, are the ones
it asked for. After the step (the updates applied), each tape's record is
written with its update ratios.

Each tape is logged under a name: ``ProbeTape(..., name=...)``, else its
model's name, with ``#2``, ``#3``... for a name used again in the same step.
Its step is ``optimizer.iterations`` of the optimizer that applied the tape's
weights, read before the update.
"""

import keras
import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.tensorflow.guard import replicated, watched as guard_module
from kgrad.backends.tensorflow.guard.tape_update import own_step_update
from kgrad.backends.tensorflow.differentiate import forward_state
from kgrad.backends.tensorflow.differentiate.branching import join_sparse, split_sparse
from kgrad.backends.tensorflow.summarize.loss_scale import inverse_loss_scale, scales_loss
from kgrad.backends.common.own_step import candidate_optimizers
from kgrad.backends.tensorflow.capture.active_collection import set_active_collection, unique_name

class TapeCollection:
    """What the ProbeTapes of one traced ``train_step`` computed.

    Args:
        model: The model whose ``train_step`` runs.
        plan: The `kgrad.backends.tensorflow.differentiate.step_plan.StepPlan`.
        probe_now: Scalar bool tensor: whether this step is probed.
        pipeline_for: ``fn(name, tape_model, scaler) -> ProbePipeline``; ``scaler``: the
            optimizer whose ``scale_loss`` scaled the tape's loss, or ``None``.
    """

    def __init__(self, model, plan, probe_now, pipeline_for, guard_state_for=None):
        self._model, self._plan, self._probe_now = model, plan, probe_now
        self._pipeline_for = pipeline_for
        self._guard_state_for = guard_state_for
        self._optimizers = candidate_optimizers(model)
        self._entries = []  # (pipeline, weights, scalars, histograms, iterations before)
        self._tapes = []
        self._names = {}
        self._checks = []  # guard: (tape name, weights, GuardState, tensors, scaler) not yet applied
        self._guard_states = []
        self.applied = []  # guard: per guarded apply, whether it applied its update
        self._scaled_by = {}  # id(scaled loss) -> the optimizer whose scale_loss made it

    #: Not the replay's `guard.own_step_replay.ReplayCollection`: tapes capture what they were asked.
    captures_everything = False

    def __enter__(self):
        set_active_collection(self)
        for optimizer in self._optimizers:
            if scales_loss(optimizer):
                # Which loss a tape differentiates was scaled, and by which
                # optimizer: its statistics are then divided back.
                object.__setattr__(optimizer, "scale_loss", self._noting_scaled(optimizer))
        if self._plan.guard is not None:
            # The step applies its updates itself: each optimizer's `apply`
            # is guarded by the check of the tape whose weights it updates.
            for optimizer in self._optimizers:
                object.__setattr__(optimizer, "apply", self._guarded(optimizer, optimizer.apply))
        return self

    def __exit__(self, exc_type, *exc_info):
        set_active_collection(None)
        for optimizer in self._optimizers:
            optimizer.__dict__.pop("apply", None)
            optimizer.__dict__.pop("scale_loss", None)
        if exc_type is None and self._checks:
            raise ValueError(
                f"kgrad.NonFiniteGuard: the gradients of ProbeTape {self._checks[0][0]!r} in the "
                f"train_step of model '{self._model.name}' were not applied by an optimizer of "
                "the model, so the guard cannot keep a non-finite update out of the weights. "
                "Apply them with an optimizer that is an attribute of the model."
            )

    def _noting_scaled(self, optimizer):
        scale_loss = optimizer.scale_loss

        def noting_scale_loss(loss):
            scaled = scale_loss(loss)
            self._scaled_by[id(scaled)] = optimizer
            return scaled

        return noting_scale_loss

    @property
    def records_layer_inputs(self):
        """Whether the tapes must keep their layers' inputs (per-example instruments)."""
        return self._plan.records_layer_inputs

    @property
    def records_attention(self):
        """Whether the tapes must keep the attention layers' q and k (attention instrument)."""
        return self._plan.records_attention

    def guard_states(self):
        """The `GuardState` of each tape that differentiated, in order."""
        return list(self._guard_states)

    def tape_names(self):
        """The names the tapes were logged under, in the order they differentiated."""
        return list(self._tapes)

    def gradient(self, tape, target, sources, output_gradients, unconnected_gradients):
        """``tape.gradient``, with the full pass and summaries on probed steps."""
        name = unique_name(self._names, tape.name)
        self._tapes.append(name)
        plan = self._plan
        scaler = self._scaled_by.get(id(target))  # the optimizer that scaled the loss, if one did
        pipeline = None if plan.probe is None else self._pipeline_for(name, tape.model, scaler)
        flat_sources = tf.nest.flatten(sources)
        where = [index for index, source in enumerate(flat_sources) if isinstance(source, keras.Variable)]
        weights = [flat_sources[index] for index in where]
        # Read before the user's step applies the update (program order).
        iterations = {id(o): tf.identity(o.iterations) for o in self._optimizers}
        arguments = (output_gradients, unconnected_gradients)

        def summarized(gradients):
            builder = pipeline.summarize(
                tape.probe, [gradients[index] for index in where], weights, x=tape.probe.input,
                prediction_gradient=_prediction_gradient(tape.probe),
            )
            return builder.scalars(), builder.histograms()

        def probed():
            gradients = tape.probed_gradient(target, flat_sources, *arguments)
            return split_sparse(gradients), summarized(gradients)

        def plain():
            gradients = tape.plain_gradient(target, flat_sources, *arguments)
            return split_sparse(gradients), pipeline.no_summaries()

        if plan.guard is not None:
            # The check needs every step's activations and gradients.
            gradients = tape.probed_gradient(target, flat_sources, *arguments)
            self._add_check(name, tape, target, [gradients[index] for index in where], weights, scaler)
            summaries = None
            if pipeline is not None:
                summaries = summarized(gradients) if plan.probes_every_step else tf.cond(
                    self._probe_now, lambda: summarized(gradients), pipeline.no_summaries
                )
        elif plan.probes_every_step:
            gradients, summaries = probed()
        else:
            gradients, summaries = tf.cond(self._probe_now, probed, plain)
        gradients = join_sparse(gradients, flat_sources) if plan.guard is None else gradients
        if pipeline is not None:
            self._entries.append((pipeline, weights, *summaries, iterations))
        return tf.nest.pack_sequence_as(sources, gradients)

    def _add_check(self, name, tape, target, gradients, weights, scaler):
        guard = self._plan.guard
        if guard.layers is not None:
            raise ValueError(
                f"kgrad.NonFiniteGuard(layers=...) does not apply to a model with its own train_step "
                f"(model '{self._model.name}'): there the guard checks what each kgrad.ProbeTape captures. "
                f"Received: layers={guard.layers!r}. Pass the layers to the ProbeTapes instead "
                "(kgrad.ProbeTape(model, layers=...)).")
        watched, on_trip_only = guard_module.watched_tensors(
            guard, tape.model, tape.probe, target, None, gradients, weights, None
        )
        names = [n for n, _ in watched]
        owned = guard_module.scaler_owned(guard, tape.model, names)  # a LossScaleOptimizer's rows
        state = self._guard_state_for(name, names, on_trip_only, guard.spikes, owned)
        self._guard_states.append(state)
        measured = [(g, w) for g, w in zip(gradients, weights) if g is not None][::-1]  # rows' order
        self._checks.append((name, weights, state, [tensor for _, tensor in watched], scaler, measured))

    def _guarded(self, optimizer, apply):
        def guarded_apply(grads, trainable_variables=None):
            variables = list(
                keras_internals.optimizer_variables(optimizer) if trainable_variables is None
                else trainable_variables
            )
            ids = {id(variable) for variable in variables}
            check = next((c for c in self._checks if any(id(w) in ids for w in c[1])), None)
            if check is None:
                return apply(grads, trainable_variables)
            self._checks.remove(check)
            if not optimizer.built:  # as Keras' apply does, outside the branch below
                with keras_internals.name_scope(optimizer.name, caller=optimizer):
                    optimizer.build(variables)
            name, _, state, tensors, scaler, measured = check
            self.applied.append(state.guarded_apply(
                tensors, tf.identity(optimizer.iterations),
                lambda: apply(grads, variables), self._plan.guard.halt_updates,
                inverse_loss_scale(scaler),
                spike_update=None if state.spikes is None else own_step_update(
                    name, optimizer, grads, variables, measured
                ),
            ))

        return guarded_apply

    def write_records(self):
        """Writes each tape's record; call after the ``train_step`` applied its updates."""
        for pipeline, weights, scalars, histograms, iterations in self._entries:
            step = iterations[id(self._applying_optimizer(pipeline.name, weights))]

            def write(pipeline=pipeline, step=step, scalars=scalars, histograms=histograms, weights=weights):
                pipeline.record(step, scalars, histograms, weights)
                return tf.no_op()

            if self._plan.probes_every_step:
                write()
            else:
                tf.cond(self._probe_now, write, tf.no_op)

    def _applying_optimizer(self, name, weights):
        # Built by now: a Keras optimizer builds on its first apply, which ran
        # in this trace if it did not run before.
        for optimizer in self._optimizers:
            if any(keras_internals.tracks(optimizer, weight) for weight in weights):
                return optimizer
        raise ValueError(
            f"kgrad.GradientProbe: no optimizer of model '{self._model.name}' applied the "
            f"gradients of ProbeTape {name!r} in its train_step, so the step to log them "
            f"at (that optimizer's `iterations`) is unknown. Received optimizers: "
            f"{[type(o).__name__ for o in self._optimizers] or 'none'}. Apply them with an "
            "optimizer that is an attribute of the model (e.g. `self.d_optimizer = "
            "keras.optimizers.Adam()` in compile(), or the model's compiled optimizer)."
        )


def run_own_train_step(model, plan, data, probe_now, pipeline_for, guard_state_for):
    """Runs ``type(model).train_step`` in a `TapeCollection`, then writes the records.

    Under several replicas the guard alone is supported: each tape's guarded
    apply is decided across replicas (`kgrad.backends.tensorflow.guard.replicated`).

    Raises:
        ValueError: With a `kgrad.GradientProbe` on several replicas (not
            supported yet), or when the step opened no `kgrad.ProbeTape`.
    """
    if plan.replicas > 1 and plan.probe is not None:
        raise ValueError(
            f"kgrad cannot probe model '{model.name}' on {plan.replicas} replicas: its class "
            f"{type(model).__name__} defines its own train_step, where kgrad.GradientProbe works "
            "on one device only yet (kgrad.NonFiniteGuard alone is supported). Train it on one "
            "device, or use kgrad.ProbeTape's results inside that train_step."
        )
    # Before the step's forward passes write it (BatchNormalization's statistics).
    put_back = forward_state.state_before_forward(model) if plan.guard is not None else None
    collection = TapeCollection(model, plan, probe_now, pipeline_for, guard_state_for)
    with collection:
        outputs = type(model).train_step(model, data)
    if not collection.tape_names():
        callback = "GradientProbe" if plan.probe is not None else "NonFiniteGuard"
        raise ValueError(
            f"kgrad.{callback} found no kgrad.ProbeTape in the train_step of model "
            f"'{model.name}' (class {type(model).__name__}), so it has nothing to check or log. "
            "In that train_step, replace `tf.GradientTape()` with `kgrad.ProbeTape(self)` "
            "(or `kgrad.ProbeTape(self.generator)` for a sub-model)."
        )
    collection.write_records()  # after the step's own updates
    if put_back is not None and collection.applied:
        # An update the guard skipped: what the step's forward passes wrote
        # came from a bad batch (or a halted step) and goes back too.
        replicated.unless_all_applied(collection.applied, put_back)
    if plan.guard is not None:
        # The flag travels with the logs that Keras reads anyway (a float 0
        # or 1 under several replicas, as `GuardState.flag`).
        tripped = tf.stack([state.flag() for state in collection.guard_states()])
        flag = tf.reduce_max(tripped) if tripped.dtype.is_floating else tf.reduce_any(tripped)
        outputs = {**outputs, guard_module.TRIPPED_OUTPUT: flag}
    return outputs


def _prediction_gradient(probe):
    """``fn() -> dJ/dŷ`` of the tape's model from the tape's own backward pass, else ``None``.

    In a custom step kgrad does not know the loss, so dJ/dŷ is what the
    tape's backward pass found: that of the captured output layer (with the
    logits shortcut's correction), or else of the prediction itself, which
    every `kgrad.ProbeTape` watches (a model ending in a layer without
    weights, such as a generator's final ``Reshape``, is not captured by default).
    """
    if probe.prediction is None:
        return None
    by_tensor = {id(tensor): name for name, tensor in probe.activations.items()}
    leaves = tf.nest.flatten(probe.prediction)
    names = [by_tensor.get(id(leaf)) for leaf in leaves]
    if None not in names and all(probe.gradients[name] is not None for name in names):
        return lambda: tf.nest.pack_sequence_as(probe.prediction, [probe.gradients[n] for n in names])
    if probe.prediction_gradient is None:
        return None
    return lambda: probe.prediction_gradient
