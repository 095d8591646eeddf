"""The probed JAX ``train_step``: Keras' own step, with capture inside its one backward pass.

`ProbedStep` is a pure function ``(state, data) -> (logs, state, {None: record})``
that computes what Keras' ``JAXTrainer.train_step`` computes (the same
``compute_loss_and_updates``, ``jax.value_and_grad`` over the trainable
variables, ``optimizer.stateless_apply`` and the metrics) and, in the same
backward pass, the statistics of dJ/d(activation), dJ/dx and dJ/dŷ through
carriers (`kgrad.backends.jax.capture.carriers`), then of the weights, their
gradients and their update. The record is ``(step, scalars, histograms)``,
device arrays named by `names` once the step has been traced; its run is
``None``, the model's own (`kgrad.backends.jax.handover.train_function`).
"""

import keras

from kgrad.backends.common.model_io import float_input_names, model_relative_path
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.capture import loss_scale
from kgrad.backends.jax.capture.instrumented import InstrumentedPass, keras_step_loss
from kgrad.backends.jax.capture.probe_taps import ProbeTaps, add_weight_rows
from kgrad.backends.jax.summarize.instruments import Instruments, optimizer_paths
from kgrad.backends.jax.summarize.summaries import SummaryRows
from kgrad.plan import selection
from kgrad.plan.tag_names import LOSS_TAG, io_names


class ProbedStep:
    """Keras' JAX ``train_step`` for ``model``, probed as ``config`` (a `ProbeConfig`) says.

    Attributes:
        names: ``{None: (scalar names, histogram names)}`` of the records, once traced.
        weight_shapes: ``{None: {weight path: shape}}`` of the trainable weights.
    """

    def __init__(self, model, config):
        self.model, self.config = model, config
        self.names = {}
        self._operations, self._keep = selection.resolve_selection(model, config.layers)
        self._paths = [model_relative_path(model, weight) for weight in model.trainable_variables]
        shapes = {path: tuple(weight.shape) for path, weight in zip(self._paths, model.trainable_variables)}
        self.weight_shapes = {None: shapes}
        self._iterations = next(
            index
            for index, variable in enumerate(model.optimizer.variables)
            if variable is model.optimizer.iterations
        )

    def __call__(self, state, data, sentinel=None):
        # ``sentinel``: fn(old state, new state, loss, gradients, rows) -> state to keep
        # (`kgrad.backends.jax.guard.steps.GuardedSteps.sentinel`, with a NonFiniteGuard);
        # its ``watch``: the guard's watched tensors, tapped in this same pass.
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        rows = SummaryRows(self.config.histograms, self.config.statistics)
        # Keras differentiates the scaled loss (mixed precision): statistics are of the true loss.
        inverse_scale = loss_scale.inverse_loss_scale(self.model.optimizer, optimizer_variables)
        probe = ProbeTaps(self.config, rows, (self._operations, self._keep), inverse_scale)
        instruments = Instruments(self.model, self.config, self._operations, self._keep)
        instruments.inverse_scale = inverse_scale
        # The instruments see each prediction before the probe's carrier replaces it (the logits by id).
        listeners = [instruments, probe]
        watch = getattr(sentinel, "watch", None)
        if watch is not None:  # the guard's checks, after the instruments (each sees the same dJ/dt)
            listeners.insert(1, watch.listener(inverse_scale))
        call = keras_step_loss(self.model, state, x, y, sample_weight)
        instrumented = InstrumentedPass(self.model, listeners)
        instrumented.discover(call, [trainable])
        result, (gradients,), forwards, cotangents = instrumented.value_and_grad(call, [trainable], True)
        _, aux = result
        unscaled_loss, y_pred, non_trainable, metrics_variables = aux
        step = optimizer_variables[self._iterations]
        new_trainable, optimizer_variables = self.model.optimizer.stateless_apply(
            optimizer_variables, gradients, trainable
        )
        logs, metrics_variables = keras_internals.update_metrics_variables(
            self.model, metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
        )
        # The loss of every probed step, unscaled, whatever is captured (as on TensorFlow).
        rows.add_scalar(LOSS_TAG, unscaled_loss)
        input_names = io_names(probe.keys_of("input"), "input", float_input_names(self.model, x))
        output_names = io_names(y_pred, "output", getattr(self.model, "output_names", None))
        probe.add_rows(forwards[-1], cotangents[-1], input_names, output_names)
        if self.config.captures("weight_gradients"):
            add_weight_rows(
                rows, self.config, self._paths, trainable, gradients, new_trainable, inverse_scale
            )
        paths, true_gradients = optimizer_paths(self._paths, self.config.statistics, gradients, inverse_scale)
        update = (paths, true_gradients, trainable, new_trainable, optimizer_variables)
        instruments.add_rows(rows, cotangents[0], forwards[0], y_pred, update)
        if inverse_scale is not None:
            rows.add_scalar("global/loss_scale", 1.0 / inverse_scale)
        if loss_scale.skips_overflowed_steps(self.model.optimizer):
            # The loss scaler skipped the update (its scale was too large; not an
            # explosion) when it did not advance the iterations.
            rows.add_scalar("global/loss_scale_skipped", optimizer_variables[self._iterations] == step)
        self.names = {None: (rows.scalar_names, rows.histogram_names)}
        record = (step, rows.scalars(), rows.histograms(self.config.bucket_count))
        new_state = (new_trainable, non_trainable, optimizer_variables, metrics_variables)
        if sentinel is not None:
            watched = None
            if watch is not None:
                watched = listeners[1].rows(forwards[1], cotangents[1], x, y_pred)
            new_state = sentinel(state, new_state, unscaled_loss, gradients, watched)
        return logs, new_state, {None: record}
