"""Keras' own JAX ``train_step`` as a model's own step with one differentiated part.

`keras_train_step` computes what Keras' ``JAXTrainer.train_step`` computes
(``compute_loss_and_updates``, ``jax.value_and_grad`` over the trainable
variables, ``optimizer.stateless_apply``, the metrics), except that its one
differentiation is a `kgrad.value_and_grad` call: while kgrad traces a
probed or guarded step, the active collection
(`kgrad.backends.jax.own_step.value_and_grad.active_parts`) differentiates it
as it differentiates each part of a model's own ``train_step``; otherwise it
is ``jax.value_and_grad``. Its `KerasStepRole` says what sets this part apart
from a part of a model's own step (each `kgrad.backends.jax.own_step.resolve.PartRole`
attribute), so that the tags stay those of Keras' step.
"""

import jax
import keras

from kgrad.backends.common.model_io import float_input_names
from kgrad.backends.common.own_step import has_own_train_step
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.capture.loss_scale import inverse_loss_scale
from kgrad.backends.jax.own_step.resolve import PartRole
from kgrad.backends.jax.own_step.value_and_grad import active_parts
from kgrad.plan.tag_names import io_names


class KerasStepRole(PartRole):
    """The role of the one part of Keras' own step.

    Its run is the model's own (``None``); the part is the whole model; its
    float inputs are tapped, named as ``fit``'s inputs are; the outputs are
    named from ŷ; ``global/loss`` is written and checked as Keras reports it
    (unscaled); the loss scale is ``model.optimizer``'s, known before the
    pass; off probed steps its update runs behind the guard's check.

    Args:
        model: The compiled model.
        x: The step's inputs.
        optimizer_variables: The step's optimizer variables (before the update).
    """

    tap_inputs = update_behind_check = True
    scale_known = True

    def __init__(self, model, x, optimizer_variables):
        super().__init__(None)
        self.model, self._x = model, x
        self.inverse_scale = inverse_loss_scale(model.optimizer, optimizer_variables)
        self.scaler = None if self.inverse_scale is None else model.optimizer

    def run(self, resolver, call):
        del resolver, call
        return None

    def input_names(self, keys):
        return io_names(keys, "input", float_input_names(self.model, self._x))

    def outputs(self, result, prediction_keys):
        del prediction_keys
        return result[1][1]  # ŷ, as compute_loss_and_updates returns it

    def logged_loss(self, result):
        return result[1][0]


def keras_train_step(model, state, data):
    """``(logs, state)``: Keras' JAX ``train_step`` of ``model``, its differentiation a part."""
    trainable, non_trainable, optimizer_variables, metrics_variables = state
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    args = (trainable, non_trainable, metrics_variables, x, y, sample_weight)
    kwargs = {"training": True, "optimizer_variables": optimizer_variables}
    parts = active_parts()
    if parts is None:
        grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
        (_, aux), gradients = grad_fn(*args, **kwargs)
    else:
        role = KerasStepRole(model, x, optimizer_variables)
        grad_fn = parts.value_and_grad
        (_, aux), gradients = grad_fn(model.compute_loss_and_updates, 0, True, role, args, kwargs)
    unscaled_loss, y_pred, non_trainable, metrics_variables = aux
    trainable, optimizer_variables = model.optimizer.stateless_apply(
        optimizer_variables, gradients, trainable
    )
    logs, metrics_variables = keras_internals.update_metrics_variables(
        model, metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
    )
    return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)


def train_step_of(model):
    """``fn(state, data) -> (logs, state)``: the step kgrad traces for ``model``."""
    if has_own_train_step(model):
        return model.train_step
    return lambda state, data: keras_train_step(model, state, data)
