"""The `kgrad.value_and_grad` calls of one traced own ``train_step``, and the optimizers that applied them.

While kgrad's train function traces a probed step of a model's own
``train_step``, a `PartCollection` is active (`active.activated`): each
`kgrad.value_and_grad` call in the step asks it to differentiate. The
differentiated arrays are matched by identity with the trainable values of
the step's ``state`` (aligned with ``model.trainable_variables``), which
names the weights and the smallest sub-model holding them all
(`kgrad.backends.jax.own_step.part.ProbedPart`). Each candidate optimizer's
``stateless_apply`` is watched too: the call that updates a part's weights
gives the step to log at (that optimizer's ``iterations`` before the update,
as on TensorFlow) and the updated weights (update ratios).
"""

import warnings

import jax
import jax.numpy as jnp
import keras

from kgrad.backends.common.moment_rules import inner_optimizer
from kgrad.backends.common.own_step import candidate_optimizers
from kgrad.backends.jax.differentiate.loss_scale import inverse_loss_scale, skips_overflowed_steps
from kgrad.backends.jax.own_step.part import ProbedPart, bind_differentiated


class PartCollection:
    """What the `kgrad.value_and_grad` calls of one traced step computed.

    Args:
        model: The model whose ``train_step`` is traced.
        config: The `kgrad.plan.options.ProbeConfig`.
        trainable: The trainable values of the step's ``state``.
    """

    def __init__(self, model, config, trainable):
        self._model, self._config = model, config
        self._variables = list(model.trainable_variables)
        self._position = {id(value): index for index, value in enumerate(trainable)}
        self._names = {}
        self.parts = []  # ProbedPart, in the order the step differentiated
        self.calls = 0  # kgrad.value_and_grad calls, also those whose arrays matched no weight
        self._pending = []  # (part, {id(weight value): index}, weight values, gradients) not applied yet
        self._records = {}  # part name -> (step, scalars, histograms)
        self._optimizers = candidate_optimizers(model)

    def __enter__(self):
        for optimizer in self._optimizers:
            watched = self._watched(optimizer, optimizer.stateless_apply)
            object.__setattr__(optimizer, "stateless_apply", watched)
        return self

    def __exit__(self, exc_type, *exc_info):
        for optimizer in self._optimizers:
            optimizer.__dict__.pop("stateless_apply", None)
        if exc_type is None and self._pending:
            part = self._pending[0][0]
            raise ValueError(
                f"kgrad.GradientProbe: no optimizer of model '{self._model.name}' applied the gradients "
                f"of kgrad.value_and_grad {part.name!r} in its train_step, so the step to log them at "
                "(that optimizer's `iterations`) is unknown. Received optimizers: "
                f"{[type(o).__name__ for o in self._optimizers] or 'none'}. Apply them with "
                "`optimizer.stateless_apply(...)` of an optimizer that is an attribute of the model "
                "(e.g. `self.d_optimizer` set in compile(), or the model's compiled optimizer)."
            )

    def value_and_grad(self, fn, argnums, has_aux, name, args, kwargs):
        """`kgrad.value_and_grad(fn, argnums, has_aux, name)(*args, **kwargs)` in a probed step."""
        result, gradients, _ = self.watched_value_and_grad(fn, argnums, has_aux, name, args, kwargs, None)
        return result, gradients

    def watched_value_and_grad(self, fn, argnums, has_aux, name, args, kwargs, watch):
        """`value_and_grad`, with the tensors of ``watch`` checked in the same pass.

        ``watch``: a guard's `kgrad.backends.jax.guard.watched.WatchedPass` of the
        part's sub-model (``watch=`` beyond the default), or ``None``. Returns
        ``(result, gradients, watched rows or None)`` (`WatchedPass.part_value_and_grad`).
        """
        self.calls += 1
        numbers = _positions(argnums, len(args))
        leaves = [leaf for number in numbers for leaf in jax.tree_util.tree_leaves(args[number])]
        indices = [self._position.get(id(leaf)) for leaf in leaves]
        if None in indices:
            warnings.warn(
                f"kgrad.value_and_grad{'' if name is None else f' {name!r}'}: {indices.count(None)} of "
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
                *bind_differentiated(fn, numbers, args, kwargs), has_aux
            )
            return result, gradients[0] if isinstance(argnums, int) else tuple(gradients), watched
        weights = [self._variables[index] for index, _ in known]
        owner = _owner(self._model, weights)
        part = ProbedPart(
            _unique(self._names, name or owner.name), owner, self._config, weights, self._optimizers
        )
        result, gradients, watched = part.differentiate(fn, numbers, has_aux, args, kwargs, watch)
        flat_gradients = [leaf for g in gradients for leaf in jax.tree_util.tree_leaves(g)]
        self._pending.append((
            part,
            {id(leaf): position for position, (_, leaf) in enumerate(known)},
            [leaf for _, leaf in known],
            [flat_gradients[k] for k, index in enumerate(indices) if index is not None],
        ))
        self.parts.append(part)
        return result, gradients[0] if isinstance(argnums, int) else tuple(gradients), watched

    def _watched(self, optimizer, stateless_apply):
        iterations = next(i for i, v in enumerate(optimizer.variables) if v is optimizer.iterations)

        def watched_stateless_apply(optimizer_variables, grads, trainable_variables):
            new_trainable, new_optimizer_variables = stateless_apply(
                optimizer_variables, grads, trainable_variables
            )
            applied = {id(value): k for k, value in enumerate(trainable_variables)}
            clipped = None
            if "optimizer" in self._config.instruments:
                # As the optimizer clips them: unscaled (mixed precision), then over all it applies
                # (global_clipnorm), not one part's.
                inverse = inverse_loss_scale(optimizer, optimizer_variables)
                unscaled = [g if inverse is None else g.astype(jnp.float32) * inverse for g in grads]
                clipped = inner_optimizer(optimizer)._clip_gradients(unscaled)
            for entry in list(self._pending):
                part, _, before, gradients = entry
                if all(id(value) in applied for value in before):
                    self._pending.remove(entry)
                    positions = [applied[id(value)] for value in before]
                    after = [new_trainable[k] for k in positions]
                    as_applied = None if clipped is None else [clipped[k] for k in positions]
                    part.add_weights(before, gradients, after, optimizer, new_optimizer_variables, as_applied)
                    rows = part.rows
                    if skips_overflowed_steps(optimizer):
                        # Its scale was too large (not an explosion) when it did not advance its iterations.
                        skipped = new_optimizer_variables[iterations] == optimizer_variables[iterations]
                        rows.add_scalar("global/loss_scale_skipped", skipped)
                    self._records[part.name] = (
                        optimizer_variables[iterations],
                        rows.scalars(),
                        rows.histograms(self._config.bucket_count),
                    )
            return new_trainable, new_optimizer_variables

        return watched_stateless_apply

    def records(self):
        """``{part name: (step, scalars, histograms)}`` of the parts whose weights were applied."""
        return dict(self._records)


def _positions(argnums, count):
    numbers = argnums if isinstance(argnums, tuple) else (argnums,)
    if any(not -count <= number < count for number in numbers):
        raise ValueError(
            f"kgrad.value_and_grad: `argnums` names positional arguments, and the function was called "
            f"with {count}. Received: argnums={argnums!r}. Pass the arrays to differentiate positionally."
        )
    return tuple(number % count for number in numbers)


def _owner(model, weights):
    """The smallest of ``model`` and its sub-models whose trainable variables hold all of ``weights``."""
    wanted = {id(weight) for weight in weights}
    layers = model._flatten_layers(include_self=False)
    owners = [model] + [layer for layer in layers if isinstance(layer, keras.Model)]
    holding = [m for m in owners if wanted <= {id(v) for v in m.trainable_variables}]
    return min(holding, key=lambda m: len(m.trainable_variables))


def _unique(counts, name):
    counts[name] = counts.get(name, 0) + 1
    return name if counts[name] == 1 else f"{name}#{counts[name]}"
