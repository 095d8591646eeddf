"""The probing ``train_step``: Keras' own step, plus capture on probed steps.

Each step runs one forward pass inside a `ProbeTape` and one backward pass.
A ``tf.cond`` on the step index picks which backward pass: the plain one over
the weights (what Keras does), or, on probed steps, the one over the weights
*and* the captured activations and inputs, followed by the summaries. Steps
that are not probed therefore compute nothing more than Keras would, except
the step-index test. A function that runs only probed steps (every step
probed, or a `GradientProbe` running Keras' own function for the others)
has no branch at all.

Under XLA, a function that runs only probed steps returns the tensors to
summarize instead of summarizing them (`SUMMARY_INPUTS_OUTPUT`), and
`ProbingStep.summarize_after_step` computes the statistics with TensorFlow's
own kernels in a function of its own: compiled into the step, they made the
MobileNet's first XLA step ~3x slower (81 against 26 CPU-s) and its peak
memory 1.9x the plain step's (1.06x after the step).
"""

import contextlib
import warnings

import keras
import numpy as np
import tensorflow as tf
from keras.src.losses import loss as keras_loss

from kgrad import guard as guard_module
from kgrad import replicas, selection, stats
from kgrad import losses
from kgrad.state import RECORD_OUTPUT, ProbeState
from kgrad.summaries import SummaryBuilder, io_names
from kgrad.tape import ProbeTape

#: The key under which a step whose statistics run after it returns
#: ``(step, tensors to summarize)``; kgrad's train function takes it out.
SUMMARY_INPUTS_OUTPUT = "kgrad_summary_inputs"


@contextlib.contextmanager
def _loss_metrics_paused(compile_loss):
    # Keras' CompileLoss updates per-output loss metrics when called; the
    # shadow evaluation for dJ/dŷ must not count twice in the logged metrics.
    # One `None` per metric, not an empty list: CompileLoss zips its losses
    # with its metrics, and an empty list stands for a single output, which
    # would drop every loss but the first.
    saved = compile_loss.__dict__.get("_metrics")
    if saved is not None:
        object.__setattr__(compile_loss, "_metrics", [None] * len(saved))
    try:
        yield
    finally:
        if saved is not None:
            object.__setattr__(compile_loss, "_metrics", saved)


def _split_sparse(gradients):
    """Gradients to return from a ``tf.cond``: IndexedSlices as (values, indices)."""
    return [
        (gradient.values, gradient.indices) if isinstance(gradient, tf.IndexedSlices) else gradient
        for gradient in gradients
    ]


def _join_sparse(gradients, weights):
    """Undoes `_split_sparse`; ``dense_shape`` is the weight's static shape.

    An IndexedSlices' ``dense_shape`` returned by ``tf.cond`` is a runtime
    value that XLA needs as a compile-time constant: XLA then recompiles the
    step for every new batch (of Embedding ids), seconds per step.
    """
    return [
        tf.IndexedSlices(gradient[0], gradient[1], tf.constant(list(weight.shape), tf.int64))
        if isinstance(gradient, (tuple, list))
        else gradient
        for gradient, weight in zip(gradients, weights)
    ]


def _build_if_needed(model, data):
    # Keras on TensorFlow builds a subclassed model inside the first trace of
    # the step, so its layers would have no weights yet when the ProbeTape
    # picks them (by default, the layers with weights), and the retrace that
    # follows variable creation would pick others. Build it first,
    # symbolically and without running anything, as Keras does under a
    # distribution strategy.
    if not all(layer.built for layer in model._flatten_layers()):
        model._symbolic_build(data_batch=data)


def _forward(model, x):
    if model._call_has_training_arg:
        return model(x, training=True)
    return model(x)


class ProbingStep:
    """A probing replacement for ``model.train_step``.

    Args:
        model: The ``keras.Model`` to train and probe.
        config: A `kgrad.config.ProbeConfig`, or ``None`` for no summaries.
        guard: A `kgrad.config.GuardConfig`, or ``None`` for no finite check.
    """

    def __init__(self, model, config=None, guard=None):
        self.model = model
        self.config = config
        self.guard = guard
        self.guard_state = None
        self.state = None
        self._counter = None
        self._snapshots = None
        self._names = None  # (scalar tags, histogram tags), known once traced
        self._traced = []  # (what it computes, function, the state it captured)
        # The guard's flag as of the latest execution (a host tensor), set by
        # `kgrad.install` from the step's outputs.
        self.guard_tripped = None
        # Set by `kgrad.install` when the function runs only for probed steps
        # (Keras' own function runs the others): it then needs no branch.
        self.only_probed_steps = False
        # Set by `kgrad.install`, whose train function takes the record out
        # of the outputs (`RECORD_OUTPUT`) into `latest_record`.
        self.records_in_outputs = False
        self.latest_record = None
        # Set by `kgrad.install` for an XLA function that runs only probed
        # steps: its statistics then run after it (`summarize_after_step`).
        self.summaries_after_step = False
        self._deferred_builder = None  # the step's SummaryBuilder, once traced
        self._after_step_function = None

    def prepare(self):
        """Resets the probe schedule and buffers; call eagerly before ``fit`` trains."""
        replicas.check_strategy(self.model, "kgrad")
        if self._counter is None:
            self._counter = replicas.create_variables(
                self.model,
                lambda: replicas.state_variable(tf.constant(0, tf.int64), "kgrad_step_counter"),
            )
        self._counter.assign(0)
        self.guard_tripped = None
        self.latest_record = None
        # A step kept from an earlier fit starts this one with empty buffers.
        self._remember_current()
        for _, _, captured in self._traced:
            if captured["state"] is not None:
                captured["state"].reset()
            if captured["guard_state"] is not None:
                captured["guard_state"].reset(everything=True)

    #: How many traced functions a step keeps (one per set of options).
    MAX_TRACED = 4

    def traced_function(self, make_function):
        """The train function for what this step now computes.

        One traced by an earlier fit for the same options is reused, with the
        buffers it writes; otherwise ``make_function()`` makes a new one
        (traced on its first call).
        """
        self._remember_current()
        key = (
            self.config, self.guard, self.model.steps_per_execution,
            self.only_probed_steps, self.records_in_outputs, self.summaries_after_step,
        )
        for index, (traced_key, _, captured) in enumerate(self._traced):
            if traced_key == key:
                self.state, self.guard_state = captured["state"], captured["guard_state"]
                self._snapshots, self._names = captured["snapshots"], captured["names"]
                self._deferred_builder = captured["deferred_builder"]
                self._after_step_function = captured["after_step_function"]
                entry = self._traced.pop(index)
                break
        else:
            self._deferred_builder = self._after_step_function = None
            entry = (key, make_function(), {})
        self._traced.append(entry)  # the most recently used last
        del self._traced[: -self.MAX_TRACED]
        return entry[1]

    def _remember_current(self):
        # The buffers the step holds are those that the function it ran last
        # captured when it was traced.
        if self._traced:
            self._traced[-1][2].update(
                state=self.state, guard_state=self.guard_state,
                snapshots=self._snapshots, names=self._names,
                deferred_builder=self._deferred_builder,
                after_step_function=self._after_step_function,
            )

    def start_at(self, step_index):
        """Tells the step that the next step is the ``step_index``-th of ``fit``.

        For executions that ran Keras' own function in between (no host
        sync: an assignment enqueued on the device).
        """
        if self.only_probed_steps:
            # Its function probes every step it runs and needs no schedule:
            # no device write per execution.
            return
        # As np.int64: TensorFlow keeps the tensor of every distinct Python
        # int it converts, ~1.4 KiB per probed step for the whole process.
        self._counter.assign(np.int64(step_index))

    def steps_run(self):
        """Steps probed or not since `prepare`; reads device memory (a host sync)."""
        return 0 if self._counter is None else int(self._counter.numpy())

    def _ensure_state(self, scalar_names, histogram_names):
        # At most ceil(k / n) steps of one execution of k steps are probed;
        # one slot more keeps the previous execution's last record, which
        # the non-finite guard reports as the last finite summaries.
        capacity = 1 + -(-self.model.steps_per_execution // self.config.every_n_steps)
        state = self.state
        if (
            state is None
            or state.capacity != capacity
            or state.scalar_names != tuple(scalar_names)
            or state.histogram_names != tuple(histogram_names)
        ):
            self.state = replicas.create_variables(
                self.model,
                lambda: ProbeState(capacity, scalar_names, histogram_names, self.config.bucket_count),
            )
        return self.state

    def _ensure_snapshots(self, weights):
        if self._snapshots is None or len(self._snapshots) != len(weights):
            self._snapshots = replicas.create_variables(
                self.model,
                lambda: [
                    replicas.state_variable(tf.zeros(w.shape, tf.float32), "kgrad_snapshot")
                    for w in weights
                ],
            )
        return self._snapshots

    def _probe_now(self):
        if self.config is None:
            return tf.constant(False)
        if self.only_probed_steps:
            return tf.constant(True)  # the schedule is kept on the host
        probe_now = tf.equal(tf.math.floormod(self._counter, self.config.every_n_steps), 0)
        self._counter.assign_add(1)
        return probe_now

    def _tape_layers(self):
        parts = [part.layers for part in (self.config, self.guard) if part is not None]
        if len(parts) == 1 or parts[0] is parts[1]:
            return parts[0]
        # Probe and guard watch different layers: capture the union.
        wanted = {
            id(operation)
            for layers in parts
            for operation in selection.resolve_layers(self.model, layers).values()
        }
        return lambda operation: id(operation) in wanted

    def _forward_and_loss(self, x, y, sample_weight):
        """Keras' forward pass, loss, loss tracker and loss scaling."""
        model = self.model
        y_pred = _forward(model, x)
        loss = model._compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
        )
        model._loss_tracker.update_state(
            keras_loss.unscale_loss_for_distribution(loss),
            sample_weight=tf.shape(next(i for i in tf.nest.flatten(x) if i is not None))[0],
        )
        if model.optimizer is not None:
            loss = model.optimizer.scale_loss(loss)
        return y_pred, loss

    def train_step(self, data):
        """Keras' ``train_step``, with the probe on selected steps."""
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if self.config is None and self.guard is None:
            return type(model).train_step(model, data)
        _build_if_needed(model, data)
        probe_now = self._probe_now()
        step = tf.identity(model.optimizer.iterations)
        with ProbeTape(
            model,
            layers=self._tape_layers(),
            watch_inputs=self.config is not None and self.config.captures("input_gradient"),
            persistent=True,
            _integer_inputs="skip",
        ) as tape:
            y_pred, loss = self._forward_and_loss(x, y, sample_weight)
        if not model.trainable_weights:
            warnings.warn("The model does not have any trainable weights.", stacklevel=2)
            return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        weights = model.trainable_weights
        if replicas.multi_replica():
            scalars, histograms = self._every_step_update(tape, loss, weights, x, y, y_pred, sample_weight)
            # No tf.cond here: under MirroredStrategy a cross-replica sync
            # (all-gather, mirrored-variable write) cannot sit in a branch.
            self._write(step, scalars, histograms, weights, where=probe_now)
            return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        batch = (x, y, y_pred, sample_weight)
        if self.guard is None:
            scalars, histograms = self._probed_update(tape, loss, weights, probe_now, *batch)
        else:
            scalars, histograms = self._guarded_update(tape, loss, weights, probe_now, step, *batch)
        record = None
        if self._defers_summaries():
            # `scalars` holds the builder's inputs: summarized after the step.
            outputs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
            # A tuple: tf.data's structures (Keras wraps the outputs in a
            # tf.experimental.Optional) take a list for one tensor.
            return {**outputs, SUMMARY_INPUTS_OUTPUT: (step, tuple(scalars))}
        if self._names is not None and self._probes_every_step():
            record = self._write(step, scalars, histograms, weights)
        elif self._names is not None:

            def write():
                self._write(step, scalars, histograms, weights)
                return tf.no_op()

            tf.cond(probe_now, write, tf.no_op)
        outputs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        if record is not None and self.records_in_outputs:
            # Every step of this function writes a record: the host takes the
            # one written last from the outputs (a function with a branch
            # would have to return zeros from the steps that do not log).
            outputs = {**outputs, RECORD_OUTPUT: record}
        if self.guard is not None:
            # The flag travels with the logs that Keras reads anyway; the
            # train function takes it out (`kgrad.install`).
            outputs = {**outputs, guard_module.TRIPPED_OUTPUT: self.guard_state.tripped.read_value()}
        return outputs

    def _if_probed(self, probe_now, probed, plain):
        """``tf.cond(probe_now, probed, plain)``, or ``probed()`` when every step is.

        Without a branch when every step is probed: XLA on CPU compiles a
        convolution's gradient inside a conditional ~20x slower.
        """
        return probed() if self._probes_every_step() else tf.cond(probe_now, probed, plain)

    def _probes_every_step(self):
        return self.config is not None and (self.only_probed_steps or self.config.every_n_steps == 1)

    def _defers_summaries(self):
        """Whether this step returns its tensors for `summarize_after_step`."""
        return (
            self.summaries_after_step
            and self.guard is None
            and self._probes_every_step()
            and not replicas.multi_replica()
        )

    def summarize_after_step(self, summary_inputs):
        """Summarizes what a step returned under `SUMMARY_INPUTS_OUTPUT`.

        Runs right after the step's function, in a ``tf.function`` of its own
        that XLA does not compile: the same statistics, with TensorFlow's
        kernels, so that the step's compilation stays close to the plain
        step's in time and memory. (XLA fuses statistics with the kernels
        that produce the tensors: a probed step of some models costs more
        this way, see ``benchmarks/RESULTS.md``.) No host sync: the call is
        enqueued like the step's.

        Args:
            summary_inputs: ``(step, tensors)`` from the step's outputs.

        Returns:
            The record written, as `kgrad.state.ProbeState.write` returns it.
        """
        if self._after_step_function is None:
            self._after_step_function = tf.function(
                self._summaries_after_step, reduce_retracing=True, autograph=False
            )
        step, tensors = summary_inputs
        return self._after_step_function(step, list(tensors))

    def _summaries_after_step(self, step, tensors):
        builder = self._deferred_builder.with_inputs(tensors)
        # The weights have been updated: `_write` compares them with the
        # snapshot the step took before its update, as it does in the step.
        return self._write(step, builder.scalars(), builder.histograms(), self.model.trainable_weights)

    def _every_step_update(self, tape, loss, weights, x, y, y_pred, sample_weight):
        """Multi-replica: summaries of the global batch computed on every step.

        They are written only on probed steps; computing them on every step
        is the price of TensorFlow not allowing collectives inside a branch.
        """
        if self.guard is not None:
            raise ValueError(
                "kgrad.NonFiniteGuard does not support tf.distribute strategies with "
                f"more than one replica yet (this model trains on "
                f"{tf.distribute.get_replica_context().num_replicas_in_sync} replicas): "
                "skipping a bad update must be decided in a branch, which "
                "MirroredStrategy forbids. Use it on a single device, or use "
                "keras.callbacks.TerminateOnNaN with the strategy."
            )
        gradients = tape.gradient(loss, weights)
        builder = self._summarize(
            tape.probe, gradients, weights, x,
            lambda: self._prediction_gradient(y, y_pred, sample_weight),
        )
        self._names = (builder.scalar_names, builder.histogram_names)
        self.model.optimizer.apply_gradients(zip(gradients, weights))
        return builder.scalars(), builder.histograms()

    def _no_summaries(self):
        # Run eagerly, only one branch runs and these zeros are never read.
        scalar_names, histogram_names = self._names or ([], [])
        bucket_count = self.config.bucket_count if self.config is not None else 1
        return tf.zeros([len(scalar_names)]), tf.zeros([len(histogram_names), bucket_count, 3])

    def _probed_update(self, tape, loss, weights, probe_now, x, y, y_pred, sample_weight):
        """One backward pass: over the probed tensors too on probed steps only.

        Returns the scalars and histograms, or, when the summaries run after
        the step, the builder's inputs and ``None``.
        """

        def probed():
            gradients = tape.gradient(loss, weights)
            prediction_gradient = lambda: self._prediction_gradient(y, y_pred, sample_weight)  # noqa: E731
            builder = self._summarize(tape.probe, gradients, weights, x, prediction_gradient)
            self._names = (builder.scalar_names, builder.histogram_names)
            if self._defers_summaries():  # no branch then: every step is probed
                self._deferred_builder = builder
                return _split_sparse(gradients), builder.inputs(), None
            return _split_sparse(gradients), builder.scalars(), builder.histograms()

        def plain():
            gradients = tf.GradientTape.gradient(tape, loss, weights)
            return (_split_sparse(gradients), *self._no_summaries())

        gradients, scalars, histograms = self._if_probed(probe_now, probed, plain)
        gradients = _join_sparse(gradients, weights)
        self.model.optimizer.apply_gradients(zip(gradients, weights))
        return scalars, histograms

    def _guarded_update(self, tape, loss, weights, probe_now, step, x, y, y_pred, sample_weight):
        """Every step: one full backward pass, the finite check, a guarded apply."""
        gradients = tape.gradient(loss, weights)
        probe = tape.probe
        # Called where it is needed: on probed steps, and on tripped ones.
        prediction_gradient = lambda: self._prediction_gradient(y, y_pred, sample_weight)  # noqa: E731
        watched, on_trip_only = guard_module.watched_tensors(
            self.guard, self.model, probe, loss,
            prediction_gradient if self.model._compile_loss is not None else None,
            gradients, weights, self._guard_layer_names(),
        )
        self.guard_state = self._ensure_guard_state([name for name, _ in watched], on_trip_only)
        if self.config is not None:
            def probed():
                builder = self._summarize(probe, gradients, weights, x, prediction_gradient)
                self._names = (builder.scalar_names, builder.histogram_names)
                return builder.scalars(), builder.histograms()

            scalars, histograms = self._if_probed(probe_now, probed, self._no_summaries)
        else:
            scalars, histograms = self._no_summaries()

        def apply():
            self.model.optimizer.apply_gradients(zip(gradients, weights))

        # After the summaries, which read the weights before the update.
        self.guard_state.guarded_apply(
            [tensor for _, tensor in watched], step, apply, self.guard.halt_updates
        )
        return scalars, histograms

    def _guard_layer_names(self):
        if self.config is None or self.config.layers is self.guard.layers:
            return None
        return list(selection.resolve_layers(self.model, self.guard.layers))

    def _ensure_guard_state(self, names, on_trip_only):
        state = self.guard_state
        if state is None or state.names != tuple(names) or state.on_trip_only != set(on_trip_only):
            self.guard_state = replicas.create_variables(
                self.model, lambda: guard_module.GuardState(names, on_trip_only)
            )
        return self.guard_state

    def _prediction_gradient(self, y, y_pred, sample_weight):
        """dJ/dŷ of the compiled loss, or ``None`` if the model has none."""
        model = self.model
        if model._compile_loss is None:
            return None

        def compiled_loss(y_true, y_copy, sample_weight=None):
            return model._compile_loss(y_true, y_copy, sample_weight)

        with _loss_metrics_paused(model._compile_loss):
            return losses.prediction_gradient(compiled_loss, y, y_pred, sample_weight)

    def _summarize(self, probe, gradients, weights, x, prediction_gradient):
        """Summaries of one probed step, unscaled from any loss scaling.

        ``prediction_gradient`` is a zero-argument callable, so that dJ/dŷ is
        only computed where it is summarized.
        """
        model, capture = self.model, self.config.captures
        # Mixed precision scales the loss; report gradients of the true loss.
        if _scales_loss(model.optimizer):
            inverse_scale = 1.0 / tf.cast(model.optimizer.scale_loss(tf.constant(1.0)), tf.float32)

            def unscale(tensor):
                return tf.cast(tensor, tf.float32) * inverse_scale
        else:
            # A multiply by 1 would be one more pass over every gradient.
            def unscale(tensor):
                return tf.cast(tensor, tf.float32)

        builder = SummaryBuilder(self.config.histograms, self.config.bucket_count)
        # Under tf.distribute, statistics are of the global batch.
        batch = replicas.gather_batch
        if capture("activations"):
            for name, tensor in probe.activations.items():
                builder.add_tensor("activation", name, batch(tensor))
        if capture("activation_gradients"):
            output_gradients = _output_gradients(probe, prediction_gradient)
            for name, gradient in probe.gradients.items():
                # A softmax/sigmoid output under cross-entropy is cut from the
                # loss by Keras' logits shortcut; its gradient is dJ/dŷ.
                gradient = output_gradients[name] if name in output_gradients else unscale(gradient)
                builder.add_tensor("grad", name, batch(gradient))
        if capture("prediction_gradient"):
            _add_prediction_gradient(
                builder, model, tf.nest.map_structure(batch, prediction_gradient())
            )
        if capture("input_gradient") and probe.input_gradient is not None:
            input_gradients = tf.nest.flatten(probe.input_gradient)
            names = io_names(input_gradients, "input", _float_input_names(model, x))
            for name, gradient in zip(names, input_gradients):
                builder.add_tensor("input_grad", name, batch(unscale(gradient)))
        if capture("weight_gradients"):
            self._add_weight_gradients(builder, gradients, weights, unscale)
        if isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
            _add_loss_scale(builder, model.optimizer)
        return builder

    def _add_weight_gradients(self, builder, gradients, weights, unscale):
        snapshots = self._ensure_snapshots(weights)
        paths = [_model_relative_path(self.model, weight) for weight in weights]
        values = [tf.cast(weight.value, tf.float32) for weight in weights]
        builder.add_scalars(
            [f"weight_norm/{path}" for path in paths],
            tf.sqrt(2.0 * tf.stack([tf.nn.l2_loss(value) for value in values])),
        )
        for value, snapshot in zip(values, snapshots):
            snapshot.assign(value)
        indices = []
        for path, gradient in zip(paths, gradients):
            if gradient is not None:
                # Each replica holds the gradient of its share of the loss.
                gradient = replicas.sum_over_replicas(unscale(tf.convert_to_tensor(gradient)))
                indices.append(builder.add_tensor("weight_grad", path, gradient))
        # From the per-weight norms of the moments: no second pass over the gradients.
        builder.add_scalar(
            "global/grad_norm",
            lambda moments, tensors: stats.combined_norm(
                tf.gather(moments[:, 0], indices),
                tf.gather(moments[:, 6], indices),
                [tensors[index] for index in indices],
            ),
        )

    def _write(self, step, scalars, histograms, weights, where=None):
        scalar_names, histogram_names = self._names
        if self.config.captures("weight_gradients"):
            paths = [_model_relative_path(self.model, weight) for weight in weights]
            # ‖w‖ before the update is already among the scalars.
            before = tf.gather(scalars, [scalar_names.index(f"weight_norm/{path}") for path in paths])
            changes = tf.sqrt(tf.stack([
                stats.sum_of_squares(tf.cast(weight.value, tf.float32) - snapshot.value())
                for weight, snapshot in zip(weights, self._snapshots)
            ]))
            # A weight that was all zeros (a bias at step 0) is compared with
            # its new value, which is all of its change: ratio 1.
            ratios = tf.where(
                before > 0, tf.math.divide_no_nan(changes, before), tf.cast(changes > 0, tf.float32)
            )
            scalars = tf.concat([scalars, ratios], axis=0)
            scalar_names = scalar_names + [f"update_ratio/{path}" for path in paths]
        if isinstance(self.model.optimizer, keras.optimizers.LossScaleOptimizer):
            # A LossScaleOptimizer skips the update of a step whose scaled
            # gradients overflowed (that is how it finds its scale, not an
            # explosion) and does not advance the iterations then.
            skipped = tf.equal(self.model.optimizer.iterations, step)
            scalars = tf.concat([scalars, tf.cast(skipped, tf.float32)[tf.newaxis]], axis=0)
            scalar_names = scalar_names + ["global/loss_scale_skipped"]
        state = self._ensure_state(scalar_names, histogram_names)
        return state.write(step, scalars, histograms, where=where)


def _scales_loss(optimizer):
    """Whether ``optimizer.scale_loss`` multiplies the loss (mixed precision, or
    a ``loss_scale_factor``), so that gradients must be divided back."""
    return (
        isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        or getattr(optimizer, "loss_scale_factor", None) is not None
    )


def _add_loss_scale(builder, optimizer):
    """The loss scale the step ran with (read before the update changes it)."""
    builder.add_scalar("global/loss_scale", optimizer.scale_loss(tf.constant(1.0)))


def _output_gradients(probe, prediction_gradient):
    """dJ/dŷ for the unconnected activations that are the model's outputs."""
    if not probe.unconnected or probe.prediction is None:
        return {}
    outputs = {id(leaf): index for index, leaf in enumerate(tf.nest.flatten(probe.prediction))}
    matches = {
        name: outputs[id(probe.activations[name])]
        for name in probe.unconnected
        if id(probe.activations[name]) in outputs
    }
    if not matches:
        return {}
    gradients = prediction_gradient()
    if gradients is None:
        return {}
    flat = tf.nest.flatten(gradients)
    return {name: tf.cast(flat[index], tf.float32) for name, index in matches.items()}


def _model_relative_path(model, weight):
    """``weight.path`` without the model's own name, stable across re-runs."""
    prefix = f"{model.name}/"
    return weight.path[len(prefix) :] if weight.path.startswith(prefix) else weight.path


def _add_prediction_gradient(builder, model, gradient):
    if gradient is None:
        return
    gradients = tf.nest.flatten(gradient)
    names = io_names(gradient, "output", getattr(model, "output_names", None))
    for name, tensor in zip(names, gradients):
        builder.add_tensor("pred_grad", name, tensor)
        norms = stats.example_norms(tensor)
        builder.add_scalar(f"pred_grad_example_norm_mean/{name}", tf.reduce_mean(norms))
        builder.add_scalar(f"pred_grad_example_norm_max/{name}", tf.reduce_max(norms))


def _float_input_names(model, x):
    """Names of the float leaves of ``x``: its dict keys, or the model's Input names."""
    leaves = tf.nest.flatten(x)
    if isinstance(x, dict):
        names = sorted(x)  # the order in which tf.nest flattens a dict
    else:
        # Keras 3 models have no `input_names`; their Input tensors are named.
        names = [getattr(tensor, "name", None) for tensor in _model_inputs(model)]
    if len(names) != len(leaves) or None in names:
        return None
    return [
        name
        for name, leaf in zip(names, leaves)
        if getattr(leaf, "dtype", None) is not None and tf.as_dtype(leaf.dtype).is_floating
    ]


def _model_inputs(model):
    try:
        return tf.nest.flatten(model.inputs or [])
    except (AttributeError, ValueError):  # subclassed models have no inputs
        return []
