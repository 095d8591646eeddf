"""One `kgrad.value_and_grad` call of a probed step: its backward pass, with capture.

`ProbedPart.differentiate` runs the instrumented pass
(`kgrad.backends.jax.capture.instrumented`) of the user's function over one
sub-model (the one whose weights are differentiated), with the probe's
listeners: the instruments, the guard's checks when it watches, the probe's
statistics. The weights' rows, and ``"optimizer"``'s (from the state of the
optimizer that applied them: unlike a TensorFlow ``ProbeTape``, which cannot
tell, a part gets ``adam_rms/``), follow once it has applied them (`add_weights`).
The tags are those a TensorFlow `kgrad.ProbeTape` of the same sub-model writes
(no dJ/dx, no ``global/loss``); Keras' own step's one part writes its own
(`kgrad.backends.jax.own_step.keras_step.KerasStepRole`).
"""

from kgrad.backends.common.model_io import model_relative_path
from kgrad.backends.jax.capture.instrumented import InstrumentedPass
from kgrad.backends.jax.capture.loss_scale import inverse_scale_of, noting_scaler
from kgrad.backends.jax.capture.probe_taps import ProbeTaps, add_weight_rows
from kgrad.backends.jax.own_step.resolve import PartRole, bind_differentiated
from kgrad.backends.jax.summarize.instruments import Instruments, add_optimizer_rows, optimizer_paths
from kgrad.backends.jax.summarize.optimizer_state import OptimizerMoments
from kgrad.backends.jax.summarize.summaries import SummaryRows
from kgrad.plan import selection
from kgrad.plan.tag_names import LOSS_TAG, io_names


class ProbedPart:
    """The probe of one differentiated sub-model in one traced step.

    Args:
        name: The run it is logged under.
        model: The sub-model whose weights are differentiated.
        config: The `ProbeConfig`.
        weights: The sub-model's differentiated ``keras.Variable``s.
        optimizers: The model's optimizers, whose ``scale_loss`` may scale the
            differentiated loss (mixed precision): the statistics are of the true loss.
        role: The part's `kgrad.backends.jax.own_step.resolve.PartRole`.

    Attributes:
        rows: Its `SummaryRows`, complete once `add_weights` has run.
        weight_shapes: ``{weight path: shape}``.
    """

    def __init__(self, name, model, config, weights, optimizers=(), role=None):
        self.name, self.model, self.config = name, model, config
        self.role = PartRole() if role is None else role
        self._optimizers = list(optimizers)
        self._inverse_scale = None  # 1 / the loss scale, once differentiated with a scaled loss
        self.rows = SummaryRows(config.histograms, config.statistics)
        self._selection = _selection(model, config.layers)
        self.paths = [model_relative_path(model, weight) for weight in weights]
        self.weight_shapes = {path: tuple(w.shape) for path, w in zip(self.paths, weights)}
        self._weights = list(weights)
        self._instruments = Instruments(model, config, *self._selection)

    def differentiate(self, fn, numbers, has_aux, args, kwargs, watch=None):
        """``(value or (value, aux), gradients of args[numbers], watched)``; adds the captured rows.

        ``watch``: a guard's `WatchedPass` of this sub-model (``watch=`` beyond
        the default), whose tensors this pass checks too (``watched``: its rows,
        `WatchTaps.part_rows`), or ``None``.
        """
        call, values = bind_differentiated(fn, numbers, args, kwargs)
        role = self.role
        probe = ProbeTaps(self.config, self.rows, self._selection)
        # The instruments first: they see each prediction before a carrier replaces it (the logits are
        # found by id); then the guard's checks; every listener sees the same dJ/dt.
        listeners = [self._instruments] + ([] if watch is None else [watch.listener()]) + [probe]
        instrumented = InstrumentedPass(self.model, listeners, tap_inputs=role.tap_inputs)
        if role.scale_known:
            instrumented.discover(call, values)
            self._inverse_scale = role.inverse_scale
        else:
            # Whether ``scale_loss`` made the value returned is seen in the shape-only pass itself.
            found = []
            instrumented.discover(noting_scaler(call, self._optimizers, has_aux, self.name, found), values)
            self._inverse_scale = None
            if found[0][0] is not None:
                self._inverse_scale = inverse_scale_of(call, values, has_aux, self._optimizers)
        # The function scaled its loss (mixed precision): every statistic is divided back.
        for listener in listeners:
            listener.inverse_scale = self._inverse_scale
        result, gradients, forwards, cotangents = instrumented.value_and_grad(call, values, has_aux)
        loss = role.logged_loss(result)
        if loss is not None:  # the loss of every probed step, unscaled, whatever is captured
            self.rows.add_scalar(LOSS_TAG, loss)
        outputs = role.outputs(result, probe.keys_of("prediction"))
        output_names = io_names(outputs, "output", getattr(self.model, "output_names", None))
        probe.add_rows(forwards[-1], cotangents[-1], role.input_names(probe.keys_of("input")), output_names)
        # The optimizer's rows follow in `add_weights`, once it is known which optimizer applies them.
        self._instruments.add_rows(self.rows, cotangents[0], forwards[0], outputs)
        if self._inverse_scale is not None:
            self.rows.add_scalar("global/loss_scale", 1.0 / self._inverse_scale)
        watched = None if watch is None else listeners[1].part_rows(forwards[1], cotangents[1], role, result)
        return result, gradients, watched

    def add_weights(self, before, gradients, after, optimizer, optimizer_state_after, as_applied=None):
        """The rows of the weights (gradient moments, norms, update ratios) and the optimizer's.

        Args:
            before, after: The part's weights before and after the update.
            gradients: Their gradients.
            optimizer: The optimizer whose ``stateless_apply`` updated them.
            optimizer_state_after: Its variables after the update.
            as_applied: With ``instruments=["optimizer"]``, the gradients as
                ``optimizer`` applied them (unscaled, clipped over all it applied).
        """
        changes = None  # ‖Δw‖ of the weights with update_ratio/, which update_rms/ reads too
        if self.config.captures("weight_gradients"):
            changes = add_weight_rows(
                self.rows, self.config, self.paths, before, gradients, after, self._inverse_scale
            )
        if as_applied is not None:
            paths = optimizer_paths(self.paths, self.config.statistics, gradients)
            add_optimizer_rows(
                self.rows, OptimizerMoments(optimizer, self._weights), paths, as_applied, before, after,
                optimizer_state_after, self.config.outlier_sigmas, changes,
            )


def _selection(model, layers):
    """`selection.resolve_selection` on the sub-model; a list keeps the names the sub-model has."""
    if not isinstance(layers, (list, tuple)):
        return selection.resolve_selection(model, layers)
    candidates, _ = selection.resolve_selection(model, "all")
    wanted = {layer if isinstance(layer, str) else id(layer) for layer in layers}
    return {name: op for name, op in candidates.items() if name in wanted or id(op) in wanted}, None
