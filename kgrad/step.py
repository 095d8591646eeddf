"""The probing ``train_step``: Keras' own step, plus capture on probed steps.

Each step runs one forward pass inside a `ProbeTape` and one backward pass.
A ``tf.cond`` on the step index picks which backward pass: the plain one over
the weights (what Keras does), or, on probed steps, the one over the weights
*and* the captured activations and inputs, followed by the summaries. Steps
that are not probed therefore compute nothing more than Keras would, except
the step-index test.
"""

import contextlib
import warnings

import keras
import tensorflow as tf
from keras.src.losses import loss as keras_loss

from kgrad import stats
from kgrad.losses import prediction_gradient
from kgrad.state import ProbeState
from kgrad.summaries import SummaryBuilder, io_names
from kgrad.tape import ProbeTape


@contextlib.contextmanager
def _loss_metrics_paused(compile_loss):
    # Keras' CompileLoss updates per-output loss metrics when called; the
    # shadow evaluation for dJ/dŷ must not count twice in the logged metrics.
    saved = compile_loss.__dict__.get("_metrics")
    if saved is not None:
        object.__setattr__(compile_loss, "_metrics", [])
    try:
        yield
    finally:
        if saved is not None:
            object.__setattr__(compile_loss, "_metrics", saved)


def _forward(model, x):
    if model._call_has_training_arg:
        return model(x, training=True)
    return model(x)


class ProbingStep:
    """A probing replacement for ``model.train_step``.

    Args:
        model: The ``keras.Model`` to train and probe.
        config: A `kgrad.config.ProbeConfig`.
    """

    def __init__(self, model, config):
        self.model = model
        self.config = config
        self.state = None
        self._counter = None
        self._snapshots = None
        self._names = None  # (scalar tags, histogram tags), known once traced

    def prepare(self):
        """Resets the probe schedule; call eagerly before ``fit`` trains."""
        if self._counter is None:
            with tf.init_scope():
                self._counter = tf.Variable(
                    tf.constant(0, tf.int64), trainable=False, name="kgrad_step_counter"
                )
        self._counter.assign(0)

    def is_probed(self, step_index):
        """Whether the ``step_index``-th step since ``fit`` began is probed."""
        return step_index % self.config.every_n_steps == 0

    def _ensure_state(self, scalar_names, histogram_names):
        # At most ceil(k / n) steps of one execution of k steps are probed.
        capacity = max(1, -(-self.model.steps_per_execution // self.config.every_n_steps))
        state = self.state
        if (
            state is None
            or state.capacity != capacity
            or state.scalar_names != tuple(scalar_names)
            or state.histogram_names != tuple(histogram_names)
        ):
            with tf.init_scope():
                self.state = ProbeState(
                    capacity, scalar_names, histogram_names, self.config.bucket_count
                )
        return self.state

    def _ensure_snapshots(self, weights):
        if self._snapshots is None or len(self._snapshots) != len(weights):
            with tf.init_scope():
                self._snapshots = [
                    tf.Variable(tf.zeros(w.shape, tf.float32), trainable=False, name="kgrad_snapshot")
                    for w in weights
                ]
        return self._snapshots

    def train_step(self, data):
        """Keras' ``train_step``, with the probe on selected steps."""
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        probe_now = tf.equal(tf.math.floormod(self._counter, self.config.every_n_steps), 0)
        self._counter.assign_add(1)
        step = tf.identity(model.optimizer.iterations)
        capture = self.config.captures
        with ProbeTape(
            model,
            layers=self.config.layers,
            watch_inputs=capture("input_gradient"),
            persistent=True,
            _integer_inputs="skip",
        ) as tape:
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
        if not model.trainable_weights:
            warnings.warn("The model does not have any trainable weights.")
            return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        weights = model.trainable_weights

        def probed():
            gradients = tape.gradient(loss, weights)
            builder = self._summarize(tape.probe, gradients, weights, x, y, y_pred, sample_weight)
            self._names = (builder.scalar_names, builder.histogram_names)
            return list(gradients), builder.scalars(), builder.histograms()

        def plain():
            gradients = tf.GradientTape.gradient(tape, loss, weights)
            # Run eagerly, only one branch runs and these zeros are never read.
            scalar_names, histogram_names = self._names or ([], [])
            return (
                list(gradients),
                tf.zeros([len(scalar_names)]),
                tf.zeros([len(histogram_names), self.config.bucket_count, 3]),
            )

        gradients, scalars, histograms = tf.cond(probe_now, probed, plain)
        model.optimizer.apply_gradients(zip(gradients, weights))
        if self._names is not None:
            tf.cond(
                probe_now,
                lambda: self._write(step, scalars, histograms, weights),
                lambda: tf.no_op(),
            )
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _summarize(self, probe, gradients, weights, x, y, y_pred, sample_weight):
        """Summaries of one probed step, unscaled from any loss scaling."""
        model, capture = self.model, self.config.captures
        # Mixed precision scales the loss; report gradients of the true loss.
        inverse_scale = 1.0 / tf.cast(model.optimizer.scale_loss(tf.constant(1.0)), tf.float32)

        def unscale(tensor):
            return tf.cast(tensor, tf.float32) * inverse_scale

        builder = SummaryBuilder(self.config.histograms, self.config.bucket_count)
        if capture("activations"):
            for name, tensor in probe.activations.items():
                builder.add_tensor("activation", name, tensor)
        if capture("activation_gradients"):
            for name, gradient in probe.gradients.items():
                builder.add_tensor("grad", name, unscale(gradient))
        if capture("prediction_gradient") and model._compile_loss is not None:
            self._summarize_prediction_gradient(builder, y, y_pred, sample_weight)
        if capture("input_gradient") and probe.input_gradient is not None:
            input_gradients = tf.nest.flatten(probe.input_gradient)
            names = io_names(input_gradients, "input", _float_input_names(model, x))
            for name, gradient in zip(names, input_gradients):
                builder.add_tensor("input_grad", name, unscale(gradient))
        if capture("weight_gradients"):
            dense = [unscale(tf.convert_to_tensor(g)) for g in gradients if g is not None]
            snapshots = self._ensure_snapshots(weights)
            for weight, gradient, snapshot in zip(weights, gradients, snapshots):
                value = tf.cast(weight.value, tf.float32)
                builder.add_scalar(f"weight_norm/{weight.path}", tf.norm(value))
                snapshot.assign(value)
                if gradient is not None:
                    gradient = unscale(tf.convert_to_tensor(gradient))
                    builder.add_tensor("weight_grad", weight.path, gradient)
            builder.add_scalar("global/grad_norm", stats.global_norm(dense))
        return builder

    def _summarize_prediction_gradient(self, builder, y, y_pred, sample_weight):
        model = self.model

        def compiled_loss(y_true, y_copy, sample_weight=None):
            return model._compile_loss(y_true, y_copy, sample_weight)

        with _loss_metrics_paused(model._compile_loss):
            gradient = prediction_gradient(compiled_loss, y, y_pred, sample_weight)
        gradients = tf.nest.flatten(gradient)
        names = io_names(gradient, "output", getattr(model, "output_names", None))
        for name, tensor in zip(names, gradients):
            builder.add_tensor("pred_grad", name, tensor)
            norms = stats.example_norms(tensor)
            builder.add_scalar(f"pred_grad_example_norm_mean/{name}", tf.reduce_mean(norms))
            builder.add_scalar(f"pred_grad_example_norm_max/{name}", tf.reduce_max(norms))

    def _write(self, step, scalars, histograms, weights):
        scalar_names, histogram_names = self._names
        if self.config.captures("weight_gradients"):
            ratios = []
            for weight, snapshot in zip(weights, self._snapshots):
                before = snapshot.value()
                update = tf.cast(weight.value, tf.float32) - before
                ratios.append(tf.norm(update) / tf.maximum(tf.norm(before), 1e-12))
            scalars = tf.concat([scalars, tf.stack(ratios)], axis=0)
            scalar_names = scalar_names + [f"update_ratio/{w.path}" for w in weights]
        state = self._ensure_state(scalar_names, histogram_names)
        state.write(step, scalars, histograms)
        return tf.no_op()


def _float_input_names(model, x):
    names = getattr(model, "input_names", None)
    if isinstance(x, dict) or not names:
        return None
    leaves = tf.nest.flatten(x)
    return [
        name
        for name, leaf in zip(names, leaves)
        if getattr(leaf, "dtype", None) is not None and tf.as_dtype(leaf.dtype).is_floating
    ]
