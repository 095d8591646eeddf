"""The probed JAX ``train_step``: Keras' own step, with capture inside its one backward pass.

`ProbedStep` is a pure function ``(state, data) -> (logs, state, record)``
that computes what Keras' ``JAXTrainer.train_step`` computes (the same
``compute_loss_and_updates``, ``jax.value_and_grad`` over the trainable
variables, ``optimizer.stateless_apply`` and the metrics) and, in the same
backward pass, the statistics of dJ/d(activation), dJ/dx and dJ/dŷ through
carriers (`kgrad.backends.jax.capture.carriers`), then of the weights, their
gradients and their update. The record is ``(step, scalars, histograms)``,
device arrays named by `names` once the step has been traced.
"""

import jax
import jax.numpy as jnp
from keras.src.trainers.data_adapters import data_adapter_utils

from kgrad.backends.common import norms
from kgrad.backends.common.model_io import float_input_names, model_relative_path
from kgrad.backends.jax.capture.carriers import CarrierLayout, tap_gradient
from kgrad.backends.jax.capture.taps import KeyedTaps, intercept, trace_taps, union_selection
from kgrad.backends.jax.differentiate import loss_scale
from kgrad.backends.jax.guard.watched import watched_only
from kgrad.backends.jax.summarize import stats
from kgrad.backends.jax.summarize.instruments import Instruments, optimizer_paths
from kgrad.backends.jax.summarize.summaries import SummaryRows
from kgrad.plan import selection
from kgrad.plan.tag_names import LOSS_TAG, io_names
from kgrad.plan.tag_selection import layers_with_a_matrix, weight_tags_written

#: The summary kind of each tap's gradient, and the capture option it needs.
_GRADIENT_KIND = {
    "activation": ("grad", "activation_gradients"),
    "input": ("input_grad", "input_gradient"),
    "prediction": ("pred_grad", "prediction_gradient"),
}


class ProbedStep:
    """Keras' JAX ``train_step`` for ``model``, probed as ``config`` (a `ProbeConfig`) says.

    Attributes:
        names: ``(scalar names, histogram names)`` of the records, once traced.
        weight_shapes: ``{weight path: shape}`` of the trainable weights.
    """

    def __init__(self, model, config):
        self.model, self.config = model, config
        self.names = None
        self._operations, self._keep = selection.resolve_selection(model, config.layers)
        self._paths = [model_relative_path(model, weight) for weight in model.trainable_variables]
        self.weight_shapes = {
            path: tuple(weight.shape) for path, weight in zip(self._paths, model.trainable_variables)
        }
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
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        rows = SummaryRows(self.config.histograms, self.config.statistics)
        taps = self._discover(trainable, non_trainable, x, rows)
        carriers = {key: layout.zeros() for key, (_, _, layout) in taps.items() if layout is not None}
        # Keras differentiates the scaled loss (mixed precision): statistics are of the true loss.
        inverse_scale = loss_scale.inverse_loss_scale(self.model.optimizer, optimizer_variables)
        instruments = Instruments(self.model, self.config, self._operations, self._keep)
        carriers.update(instruments.carriers(trainable, non_trainable, x))
        watch = getattr(sentinel, "watch", None)
        operations, keep = self._operations, self._keep
        if watch is not None:
            watched_kinds = watch.discover(trainable, non_trainable, x)
            carriers.update(watch.carriers_among_others(watched_kinds))
            operations, keep = union_selection((self._operations, self._keep), watch.selection)

        def loss_and_forward(trainable, carriers):
            forward, seen, checked = {}, [], {}
            if watch is not None:
                guard_tap = watch.tap(watched_kinds, watched_only(carriers), checked, inverse_scale)

            def tap(key, kind, tensor):
                if watch is not None:  # the guard's check, inside the probe's (both see the same dJ/dt)
                    tensor = guard_tap(key, kind, tensor)
                if key not in taps:  # tapped for the guard only
                    return tensor
                if kind == "prediction":
                    instruments.see_prediction(seen, tensor)
                if kind == "activation" and self.config.captures("activations"):
                    wants = rows.wants_histogram("activation", tensor.shape)
                    columns = rows.columns("activation", tensor.shape)
                    forward[key] = (tensor, self._buckets if wants else None, columns)
                if key in carriers:
                    return tap_gradient(tensor, carriers[key], taps[key][2], inverse_scale)
                return tensor

            with intercept(self.model, operations, KeyedTaps(tap, keep)), instruments.recording(
                carriers, inverse_scale
            ):
                loss, aux = self.model.compute_loss_and_updates(
                    trainable,
                    non_trainable,
                    metrics_variables,
                    x,
                    y,
                    sample_weight,
                    training=True,
                    optimizer_variables=optimizer_variables,
                )
            # The activations' statistics, behind one branch for all of them.
            forward = dict(zip(forward, stats.summarize_group(list(forward.values()))))
            return loss, (aux, forward, seen, checked)

        grad_fn = jax.value_and_grad(loss_and_forward, argnums=(0, 1), has_aux=True)
        (_, (aux, forward, seen, checked)), (gradients, carried) = grad_fn(trainable, carriers)
        unscaled_loss, y_pred, non_trainable, metrics_variables = aux
        step = optimizer_variables[self._iterations]
        new_trainable, optimizer_variables = self.model.optimizer.stateless_apply(
            optimizer_variables, gradients, trainable
        )
        logs, metrics_variables = self.model._update_metrics_variables(
            metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
        )
        # The loss of every probed step, unscaled, whatever is captured (as on TensorFlow).
        rows.add_scalar(LOSS_TAG, unscaled_loss)
        self._add_captured(rows, taps, forward, carried, x, y_pred)
        if self.config.captures("weight_gradients"):
            self._add_weights(rows, trainable, gradients, new_trainable, inverse_scale)
        paths, true_gradients = optimizer_paths(self._paths, self.config.statistics, gradients, inverse_scale)
        update = (paths, true_gradients, trainable, new_trainable, optimizer_variables)
        instruments.add_rows(rows, carried, seen, y_pred, update)
        if inverse_scale is not None:
            rows.add_scalar("global/loss_scale", 1.0 / inverse_scale)
        if loss_scale.skips_overflowed_steps(self.model.optimizer):
            # The loss scaler skipped the update (its scale was too large; not an
            # explosion) when it did not advance the iterations.
            rows.add_scalar("global/loss_scale_skipped", optimizer_variables[self._iterations] == step)
        self.names = (rows.scalar_names, rows.histogram_names)
        record = (step, rows.scalars(), rows.histograms(self.config.bucket_count))
        new_state = (new_trainable, non_trainable, optimizer_variables, metrics_variables)
        if sentinel is not None:
            watched = None
            if watch is not None:
                watched = watch.rows(watched_kinds, checked, watched_only(carried), x, y_pred)
            new_state = sentinel(state, new_state, unscaled_loss, gradients, watched)
        return logs, new_state, record

    @property
    def _buckets(self):
        return self.config.bucket_count if self.config.histograms else None

    def _discover(self, trainable, non_trainable, x, rows):
        """``{key: (kind, shape, carrier layout or None)}`` of the taps of one forward pass, in order.

        Found by tracing the forward pass once more for shapes only
        (``jax.eval_shape``): the carriers are arguments of the differentiated
        function, so they must exist before it is traced.
        """
        found = {}

        def record(key, kind, tensor):
            gradient_kind, option = _GRADIENT_KIND[kind]
            layout = None
            if self.config.captures(option):
                wants = rows.wants_histogram(gradient_kind, tensor.shape)
                layout = CarrierLayout(
                    self._buckets if wants else None,
                    example_norms=kind == "prediction",
                    columns=rows.columns(gradient_kind, tensor.shape),
                )
            found[key] = (kind, tuple(tensor.shape), layout)

        trace_taps(self.model, self._operations, self._keep, record, trainable, non_trainable, x)
        return found

    def _add_captured(self, rows, taps, forward, carried, x, y_pred):
        if self.config.captures("activations"):
            for key, (row, histogram) in forward.items():
                rows.add("activation", key, row, histogram, taps[key][1])
        names = {
            "input": io_names(
                [key for key in taps if taps[key][0] == "input"], "input", float_input_names(self.model, x)
            ),
            "prediction": io_names(y_pred, "output", getattr(self.model, "output_names", None)),
        }
        order = {"input": 0, "prediction": 0}
        for key, (kind, shape, layout) in taps.items():
            if layout is None:
                continue
            name = key
            if kind in order:
                name, order[kind] = names[kind][order[kind]], order[kind] + 1
            row, histogram, example = layout.split(carried[key])
            rows.add(_GRADIENT_KIND[kind][0], name, row, histogram, shape)
            if example is not None:
                rows.add_scalar(f"pred_grad_example_norm_mean/{name}", example[0])
                rows.add_scalar(f"pred_grad_example_norm_max/{name}", example[1])

    def _add_weights(self, rows, before, gradients, after, inverse_scale):
        statistics = self.config.statistics
        with_a_matrix = layers_with_a_matrix(self._paths, list(self.weight_shapes.values()))
        gradient_norms, items, matrices = [], [], []
        for path, gradient in zip(self._paths, gradients):
            if inverse_scale is not None:
                gradient = gradient.astype(jnp.float32) * inverse_scale
            has_matrix = path.rpartition("/")[0] in with_a_matrix
            wants = rows.wants_histogram("weight_grad", gradient.shape, has_matrix)
            # The norm of every weight's gradient enters global/grad_norm.
            columns = rows.columns("weight_grad", gradient.shape, has_matrix, extra=(0,))
            items.append((gradient, self._buckets if wants else None, columns))
            matrices.append(has_matrix)
        # Behind one branch for every weight gradient (`stats.summarize_group`).
        summaries = stats.summarize_group(items)
        for path, weight, gradient, updated, has_matrix, (row, histogram) in zip(
            self._paths, before, gradients, after, matrices, summaries
        ):
            gradient_norms.append(row[0])
            rows.add("weight_grad", path, row, histogram, gradient.shape, has_matrix)
            if weight_tags_written(statistics, gradient, has_matrix):
                norm = norms.safe_norm(jnp.ravel(weight).astype(jnp.float32))
                change = norms.safe_norm(jnp.ravel(updated.astype(jnp.float32) - weight.astype(jnp.float32)))
                rows.add_scalar(f"weight_norm/{path}", norm)
                # A weight that was all zeros (a bias at step 0): all of its change, ratio 1.
                rows.add_scalar(
                    f"update_ratio/{path}",
                    jnp.where(norm > 0, change / jnp.where(norm > 0, norm, 1.0), change > 0),
                )
        rows.add_scalar("global/grad_norm", norms.combined_norm(gradient_norms))
