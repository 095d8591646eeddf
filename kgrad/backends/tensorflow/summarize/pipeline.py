"""The probing pipeline: from what one backward pass captured to a record for the host.

A `ProbePipeline` serves one probed model, or one `kgrad.ProbeTape` of a
custom ``train_step``. In the traced step it *summarizes* (`summarize`: the
statistics of the activations, dJ/d(activation), dJ/dŷ, dJ/dx and weight
gradients, on device, unscaled from any loss scaling) and *hands over*
(`record`: update ratios ‖Δw‖/‖w‖ from the weights before and after the
update, then one row of a `kgrad.backends.tensorflow.handover.state.ProbeState` ring buffer). On the host,
`read_since` returns the `kgrad.ProbeRecord`s written since the last read.

It knows nothing about ``fit``, schedules or branches: the caller decides
which steps are summarized (`differentiate.step`, `differentiate.custom_step`).

Example:

>>> import keras, tensorflow as tf
>>> from kgrad.plan.options import ProbeConfig
>>> from kgrad.backends.tensorflow.capture.tape import ProbeTape
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
>>> pipeline = ProbePipeline(model, ProbeConfig(histograms=False), capacity=2)
>>> with ProbeTape(model) as tape:
...     loss = tf.reduce_sum(model(tf.ones((3, 2))))
>>> gradients = tape.gradient(loss, model.trainable_weights)
>>> builder = pipeline.summarize(tape.probe, gradients, model.trainable_weights)
>>> _ = pipeline.record(0, builder.scalars(), builder.histograms(), model.trainable_weights)
>>> records, _ = pipeline.read_since(0)
>>> round(records[0].scalars["grad_norm/out"], 5) == round(3 ** 0.5, 5)  # ‖ones(3, 1)‖
True
"""

import math

import keras
import tensorflow as tf

from kgrad.backends.tensorflow.summarize import norms
from kgrad.backends.tensorflow.handover import replicas
from kgrad.backends.tensorflow.handover.state import ProbeState
from kgrad.backends.tensorflow.summarize.loss_scale import unscaler
from kgrad.backends.tensorflow.summarize import model_io
from kgrad.backends.tensorflow.summarize.summaries import SummaryBuilder
from kgrad.backends.tensorflow.summarize.weight_snapshots import WeightSnapshots
from kgrad.backends.tensorflow.summarize.instrument_summaries import add_instruments
from kgrad.plan.tag_names import LOSS_TAG, io_names
from kgrad.plan.tag_selection import layers_with_a_matrix, weight_tags_written


class ProbePipeline:
    """Summaries and device buffer of one probed model (or one tape).

    Args:
        model: The model whose weights and layers are summarized; weight
            tags are paths relative to it.
        config: The `kgrad.plan.options.ProbeConfig`.
        capacity: Records the device buffer holds (probed steps per
            execution, plus one).
        optimizer: The optimizer that applies the gradients, for the loss
            scale (``LossScaleOptimizer``: gradients are divided back, the
            loss-scale tags added), or ``None``.
        name: The name of the tape it serves, or ``None`` for a model's own probe.
    """

    def __init__(self, model, config, capacity, optimizer=None, name=None):
        self.model = model
        self.name = name
        self.config = config
        self.capacity = capacity
        self.optimizer = optimizer
        self.state = None
        self.names = None  # (scalar tags, histogram tags), known once traced
        self.weight_shapes = {}  # weight path -> shape, known once traced (for the logs)
        self._snapshots = WeightSnapshots(model)  # ‖w‖ before, ‖Δw‖ after the update
        self._deferred_builder = None
        self._after_step_function = None

    # -- summarize (graph code) ------------------------------------------------------

    def summarize(self, probe, gradients, weights, x=None, prediction_gradient=None, loss=None):
        """The `SummaryBuilder` of one probed step.

        Args:
            probe: The step's `kgrad.ProbeResult`.
            gradients: Gradients of ``weights`` (of the possibly scaled loss).
            weights: The trainable weights, before the update.
            x: The model's input, to name its gradients (or ``None``).
            prediction_gradient: ``fn() -> dJ/dŷ`` or ``None``; called only
                if dJ/dŷ is captured.
            loss: The scalar loss differentiated (possibly scaled), for
                ``global/loss``, or ``None``.
        """
        capture, unscale = self.config.captures, unscaler(self.optimizer)
        builder = SummaryBuilder(
            self.config.histograms, self.config.bucket_count, statistics=self.config.statistics
        )
        # Under tf.distribute, statistics are of the global batch.
        batch = replicas.gather_batch
        if capture("activations"):
            for name, tensor in probe.activations.items():
                builder.add_tensor("activation", name, batch(tensor))
        if capture("activation_gradients"):
            for name, gradient in probe.gradients.items():
                if gradient is not None:  # None: unknown (see ProbeResult.gradients)
                    builder.add_tensor("grad", name, batch(unscale(gradient)))
        if capture("prediction_gradient") and prediction_gradient is not None:
            model_io.add_prediction_gradient(
                builder, self.model, tf.nest.map_structure(batch, prediction_gradient())
            )
        if capture("input_gradient") and probe.input_gradient is not None:
            input_gradients = tf.nest.flatten(probe.input_gradient)
            names = io_names(input_gradients, "input", model_io.float_input_names(self.model, x))
            for name, gradient in zip(names, input_gradients):
                builder.add_tensor("input_grad", name, batch(unscale(gradient)))
        if capture("weight_gradients"):
            self._add_weight_gradients(builder, gradients, weights, unscale)
        if loss is not None:
            # Unscaled, and of the global batch (each replica's is its share).
            builder.add_scalar(LOSS_TAG, replicas.sum_over_replicas(unscale(loss)))
        if self.config.instruments:
            add_instruments(self, builder, probe, gradients, weights, unscale)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            # The loss scale the step ran with (read before the update changes it).
            builder.add_scalar("global/loss_scale", self.optimizer.scale_loss(tf.constant(1.0)))
        self.names = (builder.scalar_names, builder.histogram_names)
        return builder

    def no_summaries(self):
        """Zeros shaped like the summaries, for the branch of steps that are not probed."""
        scalar_names, histogram_names = self.names or ([], [])
        return (
            tf.zeros([len(scalar_names)]),
            tf.zeros([len(histogram_names), self.config.bucket_count, 3]),
        )

    def _add_weight_gradients(self, builder, gradients, weights, unscale):
        paths = [model_io.model_relative_path(self.model, weight) for weight in weights]
        self.weight_shapes = {path: tuple(weight.shape) for path, weight in zip(paths, weights)}
        with_a_matrix = layers_with_a_matrix(paths, [weight.shape for weight in weights])
        matrix = [path.rpartition("/")[0] in with_a_matrix for path in paths]
        # ‖w‖ and the update ratio only of the weights whose dJ/dw norm is
        # written (by default not of biases): one snapshot copy, one norm and
        # one norm of the change less per weight that nobody reads.
        tracked = [
            (weight, path)
            for weight, path, gradient, has_matrix in zip(weights, paths, gradients, matrix)
            if weight_tags_written(self.config.statistics, gradient, has_matrix)
        ]
        if tracked:
            # Kept for `record`, which compares them with the updated weights.
            builder.add_scalars(
                [f"weight_norm/{path}" for _, path in tracked],
                self._snapshots.norms_before([weight for weight, _ in tracked]),
            )
        indices = []
        for path, gradient, has_matrix in zip(paths, gradients, matrix):
            if gradient is not None:
                # Each replica holds the gradient of its share of the loss.
                gradient = replicas.sum_over_replicas(unscale(tf.convert_to_tensor(gradient)))
                indices.append(builder.add_tensor("weight_grad", path, gradient, has_matrix))
        # From the per-weight norms of the moments: no second pass over the gradients.
        builder.add_scalar(
            "global/grad_norm",
            lambda moments, tensors: norms.combined_norm(tf.gather(moments[:, 0], indices)),
        )

    # -- summarize after an XLA step -------------------------------------------------

    def defer(self, builder):
        """The builder's input tensors, to summarize after the step (`summarize_after_step`)."""
        self._deferred_builder = builder
        return builder.inputs()

    def summarize_after_step(self, step, tensors, weights):
        """Summarizes and records what a step returned instead of summaries.

        Runs right after the step's function, in a ``tf.function`` of its own
        that XLA does not compile: the same statistics, with TensorFlow's
        kernels, so that the step's compilation stays close to the plain
        step's in time and memory. No host sync: it is enqueued like the step.

        Returns:
            The record written, as `record` returns it.
        """
        if self._after_step_function is None:
            def summarize_and_record(step, tensors):
                builder = self._deferred_builder.with_inputs(tensors)
                # The weights have been updated: `record` compares them with
                # the snapshot taken before the update, as in the step.
                return self.record(step, builder.scalars(), builder.histograms(), weights)

            self._after_step_function = tf.function(
                summarize_and_record, reduce_retracing=True, autograph=False
            )
        return self._after_step_function(step, list(tensors))

    # -- hand over -------------------------------------------------------------------

    def record(self, step, scalars, histograms, weights, where=None):
        """Adds the update ratios and writes one record; run after the update.

        Args:
            step: The record's step (``optimizer.iterations`` before the update).
            scalars: ``[n]`` scalars in the builder's ``scalar_names`` order.
            histograms: ``[k, buckets, 3]`` histograms.
            weights: The weights summarized, now updated.
            where: Optional scalar bool tensor: write only where true, without
                a branch (multi-replica steps).

        Returns:
            ``(written, step, scalars, histograms)``, see `ProbeState.write`.
        """
        scalar_names, histogram_names = self.names
        tracked = []
        if self.config.captures("weight_gradients"):
            # The weights whose ‖w‖ before the update is among the scalars
            # (see `_add_weight_gradients`), in the order of their snapshots.
            written = set(scalar_names)
            for weight in weights:
                path = model_io.model_relative_path(self.model, weight)
                if f"weight_norm/{path}" in written:
                    tracked.append((weight, path))
        if tracked:
            paths = [path for _, path in tracked]
            before = tf.gather(scalars, [scalar_names.index(f"weight_norm/{path}") for path in paths])
            changes = self._snapshots.changes([weight for weight, _ in tracked])
            # A weight that was all zeros (a bias at step 0) is compared with
            # its new value, which is all of its change: ratio 1.
            ratios = tf.where(
                before > 0, tf.math.divide_no_nan(changes, before), tf.cast(changes > 0, tf.float32)
            )
            scalars = tf.concat([scalars, ratios], axis=0)
            scalar_names = scalar_names + [f"update_ratio/{path}" for path in paths]
            if "optimizer" in self.config.instruments:  # ‖Δw‖/√n
                sizes = [float(max(math.prod(weight.shape), 1)) for weight, _ in tracked]
                scalars = tf.concat([scalars, changes / tf.sqrt(tf.constant(sizes))], axis=0)
                scalar_names = scalar_names + [f"update_rms/{path}" for path in paths]
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            # A LossScaleOptimizer skips the update of a step whose scaled
            # gradients overflowed (that is how it finds its scale, not an
            # explosion) and does not advance the iterations then.
            skipped = tf.equal(self.optimizer.iterations, step)
            scalars = tf.concat([scalars, tf.cast(skipped, tf.float32)[tf.newaxis]], axis=0)
            scalar_names = scalar_names + ["global/loss_scale_skipped"]
        state = self._ensure_state(scalar_names, histogram_names)
        return state.write(step, scalars, histograms, where=where)

    def _ensure_state(self, scalar_names, histogram_names):
        state = self.state
        if (
            state is None
            or state.scalar_names != tuple(scalar_names)
            or state.histogram_names != tuple(histogram_names)
        ):
            self.state = replicas.create_variables(
                self.model,
                lambda: ProbeState(
                    self.capacity, scalar_names, histogram_names, self.config.bucket_count
                ),
            )
        return self.state

    # -- host side -------------------------------------------------------------------

    def reset(self):
        """Empties the buffer, for a new ``fit``."""
        if self.state is not None:
            self.state.reset()

    def read_since(self, delivered, latest=None):
        """The records written after the first ``delivered``; see `ProbeState.read_since`."""
        if self.state is None:
            return [], delivered
        return self.state.read_since(delivered, latest=latest)
