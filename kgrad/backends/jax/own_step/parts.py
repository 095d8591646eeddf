"""The probed JAX step: its `kgrad.value_and_grad` calls capture (Keras' own step has one).

`ProbedStep` traces the model's step with a `PartCollection` active: each
`kgrad.value_and_grad` call is resolved to its part
(`kgrad.backends.jax.own_step.resolve`) and probed as a
`kgrad.backends.jax.own_step.part.ProbedPart`. Each candidate optimizer's
``stateless_apply`` is watched: the call that updates a part's weights gives
the step to log at (its ``iterations`` before the update, as on TensorFlow)
and the updated weights. The records leave the jitted step beside ``(logs,
state)``, one per named part.
"""

import functools
import warnings

import jax
import jax.numpy as jnp

from kgrad.backends.common.calls import replaced_calls
from kgrad.backends.common.moment_rules import inner_optimizer
from kgrad.backends.common.model_io import model_relative_path
from kgrad.backends.common.own_step import candidate_optimizers, has_own_train_step
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.capture.loss_scale import inverse_loss_scale, skips_overflowed_steps
from kgrad.backends.jax.own_step.keras_step import train_step_of
from kgrad.backends.jax.own_step.part import ProbedPart
from kgrad.backends.jax.own_step.resolve import (
    PartResolver, as_returned, as_role, bind_differentiated, no_part_error, unapplied_error,
)
from kgrad.backends.jax.own_step.value_and_grad import activated


class PartCollection:
    """What the `kgrad.value_and_grad` calls of one traced step computed.

    Args:
        model: The model whose ``train_step`` is traced.
        config: The `kgrad.plan.options.ProbeConfig`.
        trainable: The trainable values of the step's ``state``.
    """

    def __init__(self, model, config, trainable):
        self._model, self._config = model, config
        self._resolver = PartResolver(model, trainable)
        self.parts = []  # ProbedPart, in the order the step differentiated
        self.calls = 0  # kgrad.value_and_grad calls, also those whose arrays matched no weight
        self._pending = []  # (part, {id(weight value): index}, weight values, gradients) not applied yet
        self._records = {}  # part name -> (step, scalars, histograms)
        self._optimizers = candidate_optimizers(model)
        self._computed = None  # the optimizer variables of the latest update as computed (`computing`)
        self._applying = False  # inside a watched update

    def __enter__(self):
        watched = [(optimizer, functools.partial(self._watched, optimizer)) for optimizer in self._optimizers]
        self._watching = replaced_calls(watched, method="stateless_apply")
        self._watching.__enter__()
        return self

    def __exit__(self, exc_type, *exc_info):
        self._watching.__exit__(None, None, None)
        if exc_type is None and self._pending:
            part, unknown = self._pending[0][0], "the step to log them at"
            raise unapplied_error("GradientProbe", self._model, part.name, unknown, self._optimizers)

    def value_and_grad(self, fn, argnums, has_aux, name, args, kwargs):
        """`kgrad.value_and_grad(fn, argnums, has_aux, name)(*args, **kwargs)` in a probed step."""
        result, gradients, _ = self.watched_value_and_grad(fn, argnums, has_aux, name, args, kwargs, None)
        return result, gradients

    def watched_value_and_grad(self, fn, argnums, has_aux, name, args, kwargs, watch):
        """`value_and_grad`, with the tensors of ``watch`` checked in the same pass.

        ``name``: the user's, or a `PartRole` (Keras' own step's). ``watch``: a
        guard's `kgrad.backends.jax.guard.watched.WatchedPass` of the part's
        sub-model (``watch=`` beyond the default), or ``None``. Returns
        ``(result, gradients, watched rows or None)`` (`WatchedPass.part_value_and_grad`).
        """
        self.calls += 1
        role = as_role(name)
        call = self._resolver.resolve(argnums, args, role.model)
        leaves, indices = call.leaves, call.indices
        if None in indices:
            warnings.warn(
                f"kgrad.value_and_grad{'' if role.name is None else f' {role.name!r}'}: "
                f"{indices.count(None)} of "
                f"the {len(leaves)} arrays it differentiates are not trainable values of the step's "
                f"`state` (model '{self._model.name}'), so their gradients are not logged. Pass the "
                "values from `state` (or slices of its list) as they are.",
                stacklevel=4,
            )
        known = [(index, leaf) for index, leaf in zip(indices, leaves) if index is not None]
        if not known:
            if watch is None:
                return (*jax.value_and_grad(fn, argnums=argnums, has_aux=has_aux)(*args, **kwargs), None)
            result, gradients, watched = watch.part_value_and_grad(
                *bind_differentiated(fn, call.numbers, args, kwargs), has_aux, role
            )
            return result, as_returned(argnums, gradients), watched
        part = ProbedPart(role.run(self._resolver, call), call.owner, self._config, call.weights,
                          self._optimizers, role)
        result, gradients, watched = part.differentiate(fn, call.numbers, has_aux, args, kwargs, watch)
        flat_gradients = [leaf for g in gradients for leaf in jax.tree_util.tree_leaves(g)]
        self._pending.append((
            part,
            {id(leaf): position for position, (_, leaf) in enumerate(known)},
            [leaf for _, leaf in known],
            [flat_gradients[k] for k, index in enumerate(indices) if index is not None],
        ))
        self.parts.append(part)
        return result, as_returned(argnums, gradients), watched

    def _watched(self, optimizer, stateless_apply):
        iterations, accumulation = keras_internals.iterations_position(optimizer)

        def watched_stateless_apply(optimizer_variables, grads, trainable_variables):
            if self._applying:  # inside an update (a guard measuring a skipped one): not the step's
                return stateless_apply(optimizer_variables, grads, trainable_variables)
            self._applying, self._computed = True, None
            try:
                new_trainable, new_optimizer_variables = stateless_apply(
                    optimizer_variables, grads, trainable_variables
                )
            finally:
                self._applying = False
            # The optimizer's values are of the update as computed, also where a guard kept it out.
            computed = new_optimizer_variables if self._computed is None else self._computed
            self._computed = None
            applied = {id(value): k for k, value in enumerate(trainable_variables)}
            clipped = None
            if "optimizer" in self._config.instruments:
                # As the optimizer clips them: unscaled (mixed precision), then over all it applies
                # (global_clipnorm), not one part's.
                inverse = inverse_loss_scale(optimizer, optimizer_variables)
                unscaled = [g.astype(jnp.float32) if inverse is None else g.astype(jnp.float32) * inverse
                            for g in grads]
                clipped = keras_internals.clip_gradients(inner_optimizer(optimizer), unscaled)
            for entry in list(self._pending):
                part, _, before, gradients = entry
                if all(id(value) in applied for value in before):
                    self._pending.remove(entry)
                    positions = [applied[id(value)] for value in before]
                    after = [new_trainable[k] for k in positions]
                    as_applied = None if clipped is None else [clipped[k] for k in positions]
                    part.add_weights(before, gradients, after, optimizer, computed, as_applied)
                    rows = part.rows
                    if skips_overflowed_steps(optimizer):
                        # Its scale was too large (not an explosion) when it did not advance its iterations.
                        skipped = computed[iterations] == optimizer_variables[iterations]
                        rows.add_scalar("global/loss_scale_skipped", skipped)
                    self._records[part.name] = (
                        optimizer_variables[iterations] // accumulation,  # Keras' `iterations`
                        rows.scalars(),
                        rows.histograms(self._config.bucket_count),
                    )
            return new_trainable, new_optimizer_variables

        return watched_stateless_apply

    def computing(self, stateless_apply):
        """``stateless_apply``, its optimizer variables noted for the probe (a guard that may keep them out).

        A guard that skips a spiking update returns the weights and optimizer
        variables of before: the probe then logs the weights the step kept
        (an update ratio of 0, as TensorFlow's probe logs a skipped step, whose
        weights did not move), but the optimizer's values (``adam_rms``, ...)
        of the moments the update computed, as TensorFlow computes them before
        the update, not those of the step before.
        """

        def noted(optimizer_variables, grads, trainable_variables):
            new_trainable, self._computed = stateless_apply(optimizer_variables, grads, trainable_variables)
            return new_trainable, self._computed

        return noted

    def records(self):
        """``{part name: (step, scalars, histograms)}`` of the parts whose weights were applied."""
        return dict(self._records)


class ProbedStep:
    """``(state, data, checked=None) -> (logs, state, {run: record})``: ``model``'s step, probed.

    The step is the model's own ``train_step``, or Keras' own
    (`kgrad.backends.jax.own_step.keras_step`: one part, logged under the
    model's own run ``None``).

    Args:
        model: A compiled model.
        config: The `kgrad.plan.options.ProbeConfig`.

    Attributes:
        names: ``{run: (scalar names, histogram names)}``, once traced.
        weight_shapes: ``{run: {weight path: shape}}`` (Keras' step: known before it is traced).
    """

    def __init__(self, model, config):
        self.model, self.config = model, config
        self.train_step = train_step_of(model)
        self.names, self.weight_shapes = {}, {}
        if not has_own_train_step(model):
            weights = model.trainable_variables
            self.weight_shapes[None] = {model_relative_path(model, w): tuple(w.shape) for w in weights}

    def __call__(self, state, data, checked=None):
        """The probed step; ``checked``: the guard's `CheckedParts` (around the probe's calls) or ``None``."""
        with PartCollection(self.model, self.config, state[0]) as parts:
            with activated(parts if checked is None else checked.around(parts)):
                logs, state = self.train_step(state, data)
        if not parts.parts and parts.calls:
            raise ValueError(
                f"kgrad.GradientProbe: kgrad.value_and_grad ran {parts.calls} time(s) in the train_step "
                f"of model '{self.model.name}', but none of the arrays it differentiated is a trainable "
                "value of the step's `state`, so no weight is known to log. Differentiate the values "
                "as they come from `state` (or list slices of it), not copies or transforms of them."
            )
        if not parts.parts:
            fix = 'same arguments; name="generator" names its run'
            raise no_part_error("GradientProbe", self.model, "log", fix)
        for part in parts.parts:
            self.names[part.name] = (part.rows.scalar_names, part.rows.histogram_names)
            self.weight_shapes[part.name] = part.weight_shapes
        return logs, state, parts.records()
