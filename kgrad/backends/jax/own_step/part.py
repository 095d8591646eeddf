"""One `kgrad.value_and_grad` call of a probed own ``train_step``: its backward pass, with capture.

`ProbedPart.differentiate` is ``jax.value_and_grad`` of the user's function
with the layers of one sub-model (the one whose weights are differentiated)
intercepted (`kgrad.backends.jax.capture.taps.intercept`): each captured
output goes through a carrier (`kgrad.backends.jax.capture.carriers`), whose
cotangent holds the statistics of dJ/d(output), so the one backward pass that
gives the user's gradients gives them too. The carriers are arguments of the
differentiated function, so a shape-only pass (``jax.eval_shape``) finds the
taps first. The weights' rows (`add_weights`) follow once the optimizer has
applied the gradients. The tags are those a TensorFlow `kgrad.ProbeTape` of
the same sub-model writes: layer and weight paths relative to the sub-model,
dJ/dŷ as ``pred_grad_*/output``, no dJ/dx (a ``ProbeTape`` watches no input
unless asked), no ``global/loss``. The instruments ``"per_example"`` (its
carriers in the same backward pass), ``"logits"`` and ``"attention"`` are
recorded in the same pass; ``"optimizer"`` once the optimizer that applies
the part's gradients is known (`add_weights`): unlike a TensorFlow
``ProbeTape``, which cannot tell, a part gets ``adam_rms/`` and
``grad_outlier_fraction/`` from that optimizer's state.
"""

import jax
import jax.numpy as jnp

from kgrad.backends.common import norms
from kgrad.backends.common.model_io import model_relative_path
from kgrad.backends.jax.capture.carriers import CarrierLayout, tap_gradient
from kgrad.backends.jax.capture.taps import KeyedTaps, intercept, union_selection
from kgrad.backends.jax.guard.watched import watched_only
from kgrad.backends.jax.own_step.loss_scale import inverse_scale_of, noting_scaled_losses, scaling_optimizer
from kgrad.backends.jax.summarize import stats
from kgrad.backends.jax.summarize.instruments import Instruments, add_optimizer_rows, optimizer_paths
from kgrad.backends.jax.summarize.optimizer_state import OptimizerMoments
from kgrad.backends.jax.summarize.summaries import SummaryRows
from kgrad.plan import selection
from kgrad.plan.tag_names import GRAD_NORM_TAG, io_names
from kgrad.plan.tag_selection import layers_with_a_matrix, weight_tags_written

#: The summary kind of each tap's gradient, and the capture option it needs.
_GRADIENT_KIND = {
    "activation": ("grad", "activation_gradients"),
    "prediction": ("pred_grad", "prediction_gradient"),
}


class ProbedPart:
    """The probe of one differentiated sub-model in one traced step.

    Args:
        name: The run it is logged under.
        model: The sub-model whose weights are differentiated.
        config: The `kgrad.plan.options.ProbeConfig`.
        weights: The sub-model's differentiated ``keras.Variable``s.
        optimizers: The model's optimizers, whose ``scale_loss`` may scale the
            differentiated loss (mixed precision): the statistics are of the true loss.

    Attributes:
        rows: Its `SummaryRows`, complete once `add_weights` has run.
        weight_shapes: ``{weight path: shape}``.
    """

    def __init__(self, name, model, config, weights, optimizers=()):
        self.name, self.model, self.config = name, model, config
        self._optimizers = list(optimizers)
        self._inverse_scale = None  # 1 / the loss scale, once differentiated with a scaled loss
        self.rows = SummaryRows(config.histograms, config.statistics)
        self._operations, self._keep = _selection(model, config.layers)
        self.paths = [model_relative_path(model, weight) for weight in weights]
        self.weight_shapes = {path: tuple(w.shape) for path, w in zip(self.paths, weights)}
        self._weights = list(weights)
        self._instruments = Instruments(model, config, self._operations, self._keep, optimizer=False)
        self._predictions = []  # the keys of the prediction taps, in the order of the pass

    @property
    def _buckets(self):
        return self.config.bucket_count if self.config.histograms else None

    def differentiate(self, fn, numbers, has_aux, args, kwargs, watch=None):
        """``(value or (value, aux), gradients of args[numbers], watched)``; adds the captured rows.

        ``watch``: a guard's `WatchedPass` of this sub-model (``watch=`` beyond
        the default), whose tensors this pass checks too (``watched``: its rows,
        `WatchedPass.part_value_and_grad`), or ``None``.
        """
        call, values = bind_differentiated(fn, numbers, args, kwargs)
        taps, scaled = self._discover(call, values, has_aux)
        # The function scaled its loss (mixed precision): every statistic is divided back, as in Keras' step.
        inverse_scale = self._inverse_scale = (
            inverse_scale_of(call, values, has_aux, self._optimizers) if scaled else None
        )
        carriers = {key: layout.zeros() for key, (_, _, layout) in taps.items() if layout is not None}
        rows, instruments = self.rows, self._instruments
        if instruments.per_example is not None:
            carriers.update(instruments.per_example.carriers_of(lambda: jax.eval_shape(call, *values)))
        operations, keep = self._operations, self._keep
        if watch is not None:
            watched_kinds = watch.part_kinds(call, values)
            carriers.update(watch.carriers_among_others(watched_kinds))
            operations, keep = union_selection((operations, keep), watch.selection)

        def with_carriers(carriers, *differentiated):
            forward, seen, checked = {}, [], {}
            guard_tap = None
            if watch is not None:
                guard_tap = watch.tap(watched_kinds, watched_only(carriers), checked, inverse_scale)

            def tap(key, kind, tensor):
                if guard_tap is not None:  # the guard's check, inside the probe's (the same dJ/dt)
                    tensor = guard_tap(key, kind, tensor)
                if key not in taps:  # tapped for the guard only
                    return tensor
                if kind == "prediction":
                    instruments.see_prediction(seen, tensor)
                if kind == "activation" and self.config.captures("activations"):
                    wants = rows.wants_histogram("activation", tensor.shape)
                    columns = rows.columns("activation", tensor.shape)
                    forward[key] = stats.summarize(tensor, self._buckets if wants else None, columns)
                if key in carriers:
                    return tap_gradient(tensor, carriers[key], taps[key][2], inverse_scale)
                return tensor

            # The instruments' recording inside kgrad's taps: it sees the tapped outputs.
            with intercept(self.model, operations, KeyedTaps(tap, keep, tap_inputs=False)), \
                    instruments.recording(carriers, inverse_scale):
                out = call(*differentiated)
            value, aux = out if has_aux else (out, None)
            return value, (aux, forward, seen, checked)

        grad_fn = jax.value_and_grad(with_carriers, argnums=tuple(range(len(numbers) + 1)), has_aux=True)
        (value, (aux, forward, seen, checked)), (carried, *gradients) = grad_fn(carriers, *values)
        self._add_captured(taps, forward, carried)
        # The optimizer's rows follow in `add_weights`, once it is known which optimizer applies them.
        instruments.add_rows(self.rows, carried, seen, self._predictions, update=None)
        if inverse_scale is not None:
            self.rows.add_scalar("global/loss_scale", 1.0 / inverse_scale)
        watched = None
        if watch is not None:
            predictions = [key for key, kind in watched_kinds.items() if kind == "prediction"]
            before, after = watch.rows(watched_kinds, checked, watched_only(carried), None, predictions)
            watched = ((watch.before, before), (watch.after, after))
        return ((value, aux) if has_aux else value), gradients, watched

    def _discover(self, call, values, has_aux):
        """``({key: (kind, shape, carrier layout or None)}, scaled)``: a shape-only pass of ``call(*values)``.

        ``scaled``: whether the value ``call`` returns is a loss an optimizer's
        ``scale_loss`` scaled.
        """
        found, notes, scaled = {}, [], []

        def record(key, kind, tensor):
            layout = None
            if kind in _GRADIENT_KIND and self.config.captures(_GRADIENT_KIND[kind][1]):
                gradient_kind = _GRADIENT_KIND[kind][0]
                wants = self.rows.wants_histogram(gradient_kind, tensor.shape)
                layout = CarrierLayout(
                    self._buckets if wants else None,
                    example_norms=kind == "prediction",
                    columns=self.rows.columns(gradient_kind, tensor.shape),
                )
            if kind != "input":
                found[key] = (kind, tuple(tensor.shape), layout)
            return tensor

        def shapes_only(*differentiated):
            with intercept(self.model, self._operations, KeyedTaps(record, self._keep, tap_inputs=False)), \
                    noting_scaled_losses(self._optimizers, notes):
                out = call(*differentiated)
            scaled.append(scaling_optimizer(notes, out, has_aux, self.name) is not None)
            return out

        jax.eval_shape(shapes_only, *values)
        return found, scaled[0]

    def _add_captured(self, taps, forward, carried):
        if self.config.captures("activations"):
            for key, (row, histogram) in forward.items():
                self.rows.add("activation", key, row, histogram, taps[key][1])
        predictions = self._predictions = [key for key, (kind, _, _) in taps.items() if kind == "prediction"]
        output_names = dict(zip(predictions, io_names(predictions, "output", _output_names(self.model))))
        for key, (kind, shape, layout) in taps.items():
            if layout is None:
                continue
            name = output_names.get(key, key)
            row, histogram, example = layout.split(carried[key])
            self.rows.add(_GRADIENT_KIND[kind][0], name, row, histogram, shape)
            if example is not None:
                self.rows.add_scalar(f"pred_grad_example_norm_mean/{name}", example[0])
                self.rows.add_scalar(f"pred_grad_example_norm_max/{name}", example[1])

    def add_weights(self, before, gradients, after, optimizer, optimizer_state_after, as_applied=None):
        """The rows of the weights (gradient moments, norms, update ratios) and the optimizer's.

        Args:
            before, after: The part's weights before and after the update.
            gradients: Their gradients.
            optimizer: The optimizer whose ``stateless_apply`` updated them.
            optimizer_state_after: Its variables after the update.
            as_applied: With ``instruments=["optimizer"]``, the gradients as
                ``optimizer`` applied them (clipped over all it applied).
        """
        if as_applied is not None:
            paths, _ = optimizer_paths(self.paths, self.config.statistics, gradients)
            add_optimizer_rows(
                self.rows, OptimizerMoments(optimizer, self._weights), paths, as_applied, before, after,
                optimizer_state_after, self.config.outlier_sigmas,
            )
        if not self.config.captures("weight_gradients"):
            return
        statistics = self.config.statistics
        if self._inverse_scale is not None:  # the gradients of the true loss, not of the scaled one
            gradients = [gradient.astype(jnp.float32) * self._inverse_scale for gradient in gradients]
        with_a_matrix = layers_with_a_matrix(self.paths, list(self.weight_shapes.values()))
        gradient_norms = []
        for path, weight, gradient, updated in zip(self.paths, before, gradients, after):
            has_matrix = path.rpartition("/")[0] in with_a_matrix
            wants = self.rows.wants_histogram("weight_grad", gradient.shape, has_matrix)
            # The norm of every weight's gradient enters global/grad_norm.
            columns = self.rows.columns("weight_grad", gradient.shape, has_matrix, extra=(0,))
            row, histogram = stats.summarize(gradient, self._buckets if wants else None, columns)
            gradient_norms.append(row[0])
            self.rows.add("weight_grad", path, row, histogram, gradient.shape, has_matrix)
            if weight_tags_written(statistics, gradient, has_matrix):
                norm = norms.safe_norm(jnp.ravel(weight).astype(jnp.float32))
                change = norms.safe_norm(jnp.ravel(updated.astype(jnp.float32) - weight.astype(jnp.float32)))
                self.rows.add_scalar(f"weight_norm/{path}", norm)
                # A weight that was all zeros (a bias at step 0): all of its change, ratio 1.
                self.rows.add_scalar(
                    f"update_ratio/{path}",
                    jnp.where(norm > 0, change / jnp.where(norm > 0, norm, 1.0), change > 0),
                )
        self.rows.add_scalar(GRAD_NORM_TAG, norms.combined_norm(gradient_norms))


def bind_differentiated(fn, numbers, args, kwargs):
    """``(call, values)``: ``fn(*args, **kwargs)`` as a function of ``args[numbers]``, and those values.

    What `kgrad.value_and_grad` differentiates: ``call(*values)`` is the call as
    the user made it, and ``call`` of other values replaces those arguments only.

    Example:

    >>> call, values = bind_differentiated(lambda a, b, c=0: a - b + c, (1,), (5, 2), {"c": 1})
    >>> values, call(*values), call(10)
    ([2], 4, -4)
    """

    def call(*differentiated):
        replaced = list(args)
        for number, value in zip(numbers, differentiated):
            replaced[number] = value
        return fn(*replaced, **kwargs)

    return call, [args[number] for number in numbers]


def _output_names(model):
    return getattr(model, "output_names", None)


def _selection(model, layers):
    """`selection.resolve_selection` on the sub-model; a list keeps the names the sub-model has."""
    if not isinstance(layers, (list, tuple)):
        return selection.resolve_selection(model, layers)
    candidates, _ = selection.resolve_selection(model, "all")
    wanted = {layer if isinstance(layer, str) else id(layer) for layer in layers}
    return {name: op for name, op in candidates.items() if name in wanted or id(op) in wanted}, None



