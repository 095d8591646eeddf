"""The guarded JAX train step of Keras' own ``train_step`` when no probe runs: the update behind the check.

`GuardedSteps.plain` is a pure function ``(state, record, data) -> (logs,
state, record)`` that computes what Keras' ``JAXTrainer.train_step``
computes with the optimizer's update behind the sentinel's ``lax.cond``
(`kgrad.backends.jax.guard.sentinel.guard_apply`), and the spike rule
(`kgrad.backends.jax.guard.spikes`). Every other guarded step goes through
`kgrad.backends.jax.guard.run.GuardRun`'s one path.
"""

import jax
import jax.numpy as jnp
import keras

from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.capture.loss_scale import inverse_loss_scale
from kgrad.backends.jax.guard import spikes as spike_rule
from kgrad.backends.jax.guard.sentinel import (
    check, guard_apply, guard_update, may_apply, next_record, select_leaves, select_whole,
)
from kgrad.backends.jax.guard.watched import WatchedPass, decode


def select_keras_state(apply, new_state, old_state):
    """Keras' ``(trainable, non-trainable, optimizer, metrics)``: the new state where ``apply``, else the old.

    A ``jnp.where`` per leaf, fused by XLA into the update that made it,
    except for the non-trainable variables: fused with the select,
    BatchNormalization's moving averages rounded differently from Keras' own
    step (an ulp); behind a ``lax.cond`` they are computed exactly as Keras
    computes them.
    """
    trainable, optimizer, metrics = select_leaves(
        apply, (new_state[0], new_state[2], new_state[3]), (old_state[0], old_state[2], old_state[3])
    )
    return (trainable, select_whole(apply, new_state[1], old_state[1]), optimizer, metrics)


def iterations_index(model):
    """The position of ``optimizer.iterations`` among the optimizer's variables (the step number)."""
    return next(
        index for index, variable in enumerate(model.optimizer.variables)
        if variable is model.optimizer.iterations
    )


class GuardedSteps:
    """The guarded steps of one model.

    Args:
        model: A compiled Keras model that uses Keras' own ``train_step``.
        halt_updates: See `guard_update`.
        compiled: Whether the steps run jitted. Eagerly, the update is
            selected after it ran (`guard_update`): a ``lax.cond`` would
            compile it, rounding unlike Keras' eager update.
        ignore_loss_scale_skips: Under a ``LossScaleOptimizer``, check the
            loss only (`kgrad.NonFiniteGuard`'s argument).

    Attributes:
        checks_gradients: Whether the weight gradients are checked.
    """

    def __init__(self, model, halt_updates, compiled=True, ignore_loss_scale_skips=True, watch=None,
                 spikes=None):
        self.model = model
        self.spikes = spikes  # a SpikeRule, or None
        self.halt_updates = halt_updates
        self.compiled = compiled
        # Under a LossScaleOptimizer overflowing gradients are how the scale is found (the
        # optimizer skips those steps itself): by default the loss alone is checked.
        self.checks_gradients = not (
            ignore_loss_scale_skips and isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        )
        self._iterations = iterations_index(model)
        # watch= beyond the default (a GuardConfig): inputs, activations and their gradients too.
        self.watch = None if watch is None else WatchedPass(model, watch, self.checks_gradients)

    def checked_gradients(self, gradients, optimizer_variables):
        """The gradients the sentinel checks: those of the true loss (none when it checks the loss only).

        Keras differentiates the scaled loss under a loss scale: the record's
        last finite norms would be the scale times too large. Multiplied
        before squaring (fused into the sums), a NaN stays a NaN and an
        overflow an Inf.
        """
        if not self.checks_gradients:
            return []
        inverse = inverse_loss_scale(self.model.optimizer, optimizer_variables)
        if inverse is None:
            return gradients
        return [gradient.astype(jnp.float32) * inverse for gradient in gradients]

    def plain(self, state, record, data):
        """Keras' ``JAXTrainer.train_step``, guarded."""
        model = self.model
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        watched = None
        if self.watch is None:
            grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
            (_, aux), gradients = grad_fn(
                trainable, non_trainable, metrics_variables, x, y, sample_weight,
                training=True, optimizer_variables=optimizer_variables,
            )
        else:
            inverse_scale = inverse_loss_scale(model.optimizer, optimizer_variables)
            aux, gradients, (before, after) = self.watch.loss_and_gradients(
                state, x, y, sample_weight, inverse_scale
            )
            watched = (decode(before), decode(after))
        unscaled_loss, y_pred, non_trainable, metrics_variables = aux
        logs, new_metrics_variables = keras_internals.update_metrics_variables(
            model, metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
        )
        if self.spikes is not None:
            return self._judged(state, record, logs, aux, gradients, watched, new_metrics_variables)
        if not self.compiled:  # eagerly: selected after the update ran, as `guard_update` does
            trainable, optimizer_variables = model.optimizer.stateless_apply(
                optimizer_variables, gradients, trainable
            )
            new_state = (trainable, non_trainable, optimizer_variables, new_metrics_variables)
            state, record = guard_update(
                state, new_state, unscaled_loss, self.checked_gradients(gradients, state[2]), record,
                state[2][self._iterations], self.halt_updates, select_keras_state, watched,
            )
            return logs, state, record

        def update(operands):
            # Runs only on a clean step: the optimizer writes in place, no select over its state.
            gradients, trainable, optimizer_variables, non_trainable = operands
            trainable, optimizer_variables = model.optimizer.stateless_apply(
                optimizer_variables, gradients, trainable
            )
            return trainable, non_trainable, optimizer_variables

        step = optimizer_variables[self._iterations]
        checked = self.checked_gradients(gradients, optimizer_variables)
        (trainable, non_trainable, optimizer_variables), record, applied = guard_apply(
            unscaled_loss, checked, record, step, update,
            (gradients, trainable, optimizer_variables, non_trainable),
            (state[0], state[1], state[2]), self.halt_updates, watched,
        )
        # The metrics are scalars: a select costs nothing, and the logs stay the step's own.
        metrics_variables = select_leaves(applied, new_metrics_variables, metrics_variables)
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables), record

    def _judged(self, state, record, logs, aux, gradients, watched, new_metrics_variables):
        """`plain`'s end with the spike rule: a spiking step is kept out as a non-finite one is."""
        model, rule = self.model, self.spikes
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        unscaled_loss, _, new_non_trainable, _ = aux
        step = optimizer_variables[self._iterations]
        checked = self.checked_gradients(gradients, optimizer_variables)
        squares, counts = check(unscaled_loss, checked, watched)
        judged = spike_rule.judge(record.spikes, rule, unscaled_loss, squares[len(squares) - len(checked):])
        veto = judged[1]
        if self.halt_updates:
            veto = veto | record.spikes.tripped
        apply = may_apply(counts, record, self.halt_updates) & jnp.logical_not(veto)

        width = (len(gradients), len(spike_rule.SKIP_COLUMNS))

        def update(operands):
            gradients, trainable, optimizer_variables, non_trainable = operands
            trainable, optimizer_variables = model.optimizer.stateless_apply(
                optimizer_variables, gradients, trainable
            )
            return (trainable, non_trainable, optimizer_variables), jnp.zeros(width, jnp.float32)

        def skipped(operands):
            # The skip's table in this branch: the update's branch then writes the weights in place.
            gradients, trainable, optimizer_variables, _ = operands
            table = spike_rule.table_if_new_spike(
                model, judged, record.spikes, gradients, trainable, optimizer_variables
            )
            return (trainable, non_trainable, optimizer_variables), table

        operands = (gradients, trainable, optimizer_variables, new_non_trainable)
        if self.compiled:
            kept, table = jax.lax.cond(apply, update, skipped, operands)
        else:  # eagerly: selected after the update ran, as `guard_update` does
            kept = select_leaves(apply, update(operands)[0], skipped(operands)[0])
            table = skipped(operands)[1]
        new_record = next_record(record, squares, counts, apply, step)
        spikes = spike_rule.record_step(rule, record.spikes, judged, table, apply)
        metrics_variables = select_leaves(apply, new_metrics_variables, metrics_variables)
        return logs, (*kept, metrics_variables), new_record._replace(spikes=spikes)


def dropped_after_trip(probe_records, tripped_before):
    """``{run: record}`` with step -1 after a trip: those steps keep the state of before, nothing to log.

    Keras' loop may run a few more steps before it sees the trip.
    """
    return {
        run: (jnp.where(tripped_before, -1, number), scalars, histograms)
        for run, (number, scalars, histograms) in probe_records.items()
    }
