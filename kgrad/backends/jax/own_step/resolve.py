"""Which part of a model's own ``train_step`` a `kgrad.value_and_grad` call differentiates.

The probe (`kgrad.backends.jax.own_step.parts`), the guard's checks
(`kgrad.backends.jax.guard.checked_parts`) and the replay
(`kgrad.backends.jax.guard.replay`) ask the same question of each
call: the differentiated arrays are matched by identity with the trainable
values of the step's ``state`` (aligned with ``model.trainable_variables``),
which names the weights and the smallest sub-model holding them all (the
"owner": ``self.discriminator``, or the model itself), and the run the part
is logged under (``name``, else the owner's name; ``#2`` when used again). Keras' own
``train_step`` is such a step with one part (`kgrad.backends.jax.own_step.keras_step`):
its call comes with a `PartRole` of its own, which says what sets it apart.

Example:

>>> call, values = bind_differentiated(lambda a, b, c=0: a - b + c, (1,), (5, 2), {"c": 1})
>>> values, call(*values), call(10)
([2], 4, -4)
"""

import dataclasses

import jax
import keras

from kgrad.backends.common.model_io import model_relative_path
from kgrad.backends.jax import keras_internals


class PartRole:
    """What a part is beyond its arrays; these defaults are a `kgrad.value_and_grad` call's.

    A part of a model's own ``train_step`` is logged as a TensorFlow
    `kgrad.ProbeTape` of its sub-model: its own run, no input tapped (its
    inputs are another part's outputs), no ``global/loss`` (its value may be
    any function), its loss scale found where ``scale_loss`` is called. Keras'
    own step overrides each (`kgrad.backends.jax.own_step.keras_step.KerasStepRole`).

    Attributes:
        name: The run the user named (``None``: the owner's name).
        model: The model that is the part (``None``: the smallest holding its weights).
        tap_inputs: Whether the model's float inputs are tapped (dJ/dx).
        scale_known: Whether ``inverse_scale`` is known before the pass.
        inverse_scale: Then 1 / the loss scale, or ``None`` (unscaled).
        scaler: Then the optimizer that scaled the loss, or ``None``.
        update_behind_check: Whether the guard may put the update of its
            gradients behind their check (a ``lax.cond``). Not a part's of a
            model's own step: a later part must see the update as the step
            computed it (the guard's report names every part a NaN reached).
    """

    model = None
    tap_inputs = update_behind_check = False
    scale_known = False
    inverse_scale = scaler = None

    def __init__(self, name=None):
        self.name = name

    def run(self, resolver, call):
        """The run the part is logged under: `PartResolver.run_name`."""
        return resolver.run_name(call, self.name)

    def input_names(self, keys):
        """The names of the input taps ``keys`` (none are tapped)."""
        return ()

    def outputs(self, result, prediction_keys):
        """The structure the output names come from: the keys of the part's predictions."""
        del result
        return prediction_keys

    def logged_loss(self, result):
        """The loss written as ``global/loss`` and checked by the guard as is, or ``None``."""
        del result


def as_role(name):
    """The `PartRole` of a `kgrad.value_and_grad` ``name`` (a role already: itself)."""
    return name if isinstance(name, PartRole) else PartRole(name)


@dataclasses.dataclass
class PartCall:
    """One `kgrad.value_and_grad` call of a step, resolved.

    Attributes:
        numbers: The positions of the differentiated arguments (non-negative).
        leaves: The differentiated arrays, flattened.
        indices: Per leaf, its position among ``model.trainable_variables``, or ``None``.
        weights: The ``keras.Variable`` of each leaf that is one.
        owner: The smallest (sub-)model holding ``weights`` (the model when there are none).
        paths: Per leaf, its weight's path in ``owner``, or ``"array:<k>"``.
    """

    numbers: tuple
    leaves: list
    indices: list
    weights: list
    owner: object
    paths: list


class PartResolver:
    """Resolves the `kgrad.value_and_grad` calls of one traced step of ``model``.

    Args:
        model: The model whose ``train_step`` runs.
        trainable: The trainable values of the step's ``state``.
    """

    def __init__(self, model, trainable):
        self.model = model
        self._variables = list(model.trainable_variables)
        self._position = {id(value): index for index, value in enumerate(trainable)}
        self._names = {}

    def resolve(self, argnums, args, owner=None):
        """The `PartCall` of differentiating ``args[argnums]``; raises for an ``argnums`` out of range.

        ``owner``: the model that is the part, or ``None`` for the smallest holding its weights.
        """
        numbers = _positions(argnums, len(args))
        leaves = [leaf for number in numbers for leaf in jax.tree_util.tree_leaves(args[number])]
        indices = [self._position.get(id(leaf)) for leaf in leaves]
        weights = [self._variables[index] for index in indices if index is not None]
        if owner is None:
            owner = _owner(self.model, weights) if weights else self.model
        paths = [
            f"array:{k}" if index is None else model_relative_path(owner, self._variables[index])
            for k, index in enumerate(indices)
        ]
        return PartCall(numbers, leaves, indices, weights, owner, paths)

    def run_name(self, part, name):
        """The run ``part`` is logged under: ``name`` or its owner's, ``#2``, ``#3`` when used again."""
        name = name or part.owner.name
        self._names[name] = self._names.get(name, 0) + 1
        count = self._names[name]
        return name if count == 1 else f"{name}#{count}"


def bind_differentiated(fn, numbers, args, kwargs):
    """``(call, values)``: ``fn(*args, **kwargs)`` as a function of ``args[numbers]``, and those values.

    What `kgrad.value_and_grad` differentiates: ``call(*values)`` is the call as
    the user made it, and ``call`` of other values replaces those arguments only.
    """

    def call(*differentiated):
        replaced = list(args)
        for number, value in zip(numbers, differentiated):
            replaced[number] = value
        return fn(*replaced, **kwargs)

    return call, [args[number] for number in numbers]


def as_returned(argnums, gradients):
    """The gradients as ``jax.value_and_grad`` returns them: one, or a tuple for a tuple ``argnums``."""
    return gradients[0] if isinstance(argnums, int) else tuple(gradients)


def no_part_error(callback, model, purpose, fix):
    """The error of a step in which ``callback`` found no `kgrad.value_and_grad` to ``purpose``."""
    return ValueError(
        f"kgrad.{callback} found no kgrad.value_and_grad in the train_step of model '{model.name}' "
        f"(class {type(model).__name__}), so it has nothing to {purpose}. In that train_step, replace "
        f"`jax.value_and_grad(...)` with `kgrad.value_and_grad(...)` ({fix})."
    )


def unapplied_error(callback, model, part, unknown, optimizers):
    """The error of a part whose gradients no optimizer of ``model`` applied: ``unknown`` is unknown."""
    return ValueError(
        f"kgrad.{callback}: no optimizer of model '{model.name}' applied the gradients of "
        f"kgrad.value_and_grad {part!r} in its train_step, so {unknown} (that optimizer's `iterations`) "
        f"is unknown. Received optimizers: {[type(o).__name__ for o in optimizers] or 'none'}. Apply "
        "them with `optimizer.stateless_apply(...)` of an optimizer that is an attribute of the model "
        "(e.g. `self.d_optimizer` set in compile(), or the model's compiled optimizer)."
    )


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
    layers = keras_internals.flatten_layers(model)
    owners = [model] + [layer for layer in layers if isinstance(layer, keras.Model)]
    holding = [m for m in owners if wanted <= {id(v) for v in m.trainable_variables}]
    return min(holding, key=lambda m: len(m.trainable_variables))
