"""The loss scale inside the JAX pass: kgrad reports the gradients of the true loss.

Under mixed precision the differentiated loss is ``optimizer.scale_loss(loss)``
(a `keras.optimizers.LossScaleOptimizer`'s dynamic scale under ``mixed_float16``,
or an optimizer's fixed ``loss_scale_factor``); its gradients are that many
times the true loss's, and the optimizer divides them back. kgrad's statistics
are of the true loss, and those of dJ/d(activation) are taken inside the
backward pass: the factor is needed before it.

In Keras' own step (``compute_loss_and_updates``) the factor is read from the
step's optimizer variables, before the update (a LossScaleOptimizer's update
changes it): `inverse_loss_scale`.

A `kgrad.value_and_grad` function of a model's own ``train_step`` computes
it at its very end. `noting_scaled_losses` notes each ``scale_loss`` call of
the model's optimizers while a function runs: the loss it scaled, and the
factor (the same ``scale_loss`` of 1, in the caller's ``StatelessScope``, so
the dynamic scale is the step's). The probe runs it in its shape-only pass
(the guard, `loss_scale_of`, in one of its own); when the value the function
returns is what ``scale_loss`` returned, `inverse_scale_of` runs the function
once more, outside the differentiated pass, for the factor alone (under
``jit`` XLA removes the rest, which nothing uses). A function that scaled a
loss but returns something else is refused: by what its gradients are scaled
is then unknown, and kgrad writes no guessed numbers. A loss multiplied by
hand is not seen; its gradients are reported as the function's, as a
TensorFlow `kgrad.ProbeTape` reports them.

Example:

>>> import jax.numpy as jnp, keras
>>> optimizer = keras.optimizers.SGD(loss_scale_factor=8.0)
>>> notes = []
>>> with noting_scaled_losses([optimizer], notes):
...     scaled = optimizer.scale_loss(jnp.float32(3.0))
>>> float(scaled), [float(factor) for _, _, factor in notes]
(24.0, [8.0])
"""

import jax
import jax.numpy as jnp
import keras

from kgrad.backends.common.calls import replaced_calls
from kgrad.backends.common.loss_scale import scales_loss


def inverse_loss_scale(optimizer, optimizer_variables):
    """1 / the factor the step's loss was scaled by (a float32 scalar), or ``None`` when unscaled.

    Example:

    >>> import keras
    >>> optimizer = keras.optimizers.SGD(loss_scale_factor=8.0)
    >>> optimizer.build([keras.Variable(1.0)])
    >>> float(inverse_loss_scale(optimizer, [v.value for v in optimizer.variables]))
    0.125
    """
    if not scales_loss(optimizer):
        return None
    mapping = list(zip(optimizer.variables, optimizer_variables))
    with keras.StatelessScope(state_mapping=mapping):
        scale = optimizer.scale_loss(jnp.float32(1.0))
    return 1.0 / jnp.asarray(scale, jnp.float32)


def skips_overflowed_steps(optimizer):
    """Whether ``optimizer`` skips the update of a step whose scaled gradients overflowed."""
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def noting_scaled_losses(optimizers, notes):
    """While the block runs, each ``scale_loss`` call appends ``(optimizer, scaled, factor)`` to ``notes``."""
    noting = [(optimizer, _noting(optimizer, notes)) for optimizer in optimizers if scales_loss(optimizer)]
    return replaced_calls(noting, method="scale_loss")


def _noting(optimizer, notes):
    def make(scale_loss):
        def noting_scale_loss(loss):
            scaled = scale_loss(loss)
            notes.append((optimizer, scaled, jnp.asarray(scale_loss(jnp.float32(1.0)), jnp.float32)))
            return scaled

        return noting_scale_loss

    return make


def scaling_optimizer(notes, out, has_aux, name):
    """The optimizer whose ``scale_loss`` made ``out``'s value, or ``None``; raises if one scaled another."""
    value = out[0] if has_aux else out
    for optimizer, scaled, _ in notes:
        if scaled is value:
            return optimizer
    if notes:
        raise ValueError(
            f"kgrad.value_and_grad {name!r}: its function called `scale_loss` of "
            f"{type(notes[0][0]).__name__} but returned another value, so by what its gradients are "
            "scaled is unknown to kgrad, and its statistics would be wrong. Return the scaled loss "
            "itself as the function's value (`return self.optimizer.scale_loss(loss), aux`, with "
            "`has_aux=True` for the unscaled loss), or scale it outside the function."
        )
    return None


def noting_scaler(call, optimizers, has_aux, name, found):
    """``call``, appending to ``found`` the ``(optimizer, factor)`` whose ``scale_loss`` made its value.

    ``(None, None)`` when no ``scale_loss`` made it; raises when one scaled another value
    (`scaling_optimizer`). Each pass that must know the scale runs its function through it.
    """

    def noting(*values):
        notes = []
        with noting_scaled_losses(optimizers, notes):
            out = call(*values)
        scaler = scaling_optimizer(notes, out, has_aux, name)
        found.append((scaler, next((factor for optimizer, _, factor in notes if optimizer is scaler), None)))
        return out

    return noting


def loss_scale_of(call, values, has_aux, optimizers, name):
    """``(optimizer, 1 / factor)`` of the loss ``call(*values)`` returns; ``(None, None)`` if unscaled."""
    if not any(scales_loss(optimizer) for optimizer in optimizers):
        return None, None
    found = []
    jax.eval_shape(noting_scaler(call, optimizers, has_aux, name, found), *values)
    if found[0][0] is None:
        return None, None
    return found[0][0], inverse_scale_of(call, values, has_aux, optimizers)


def value_and_grad_noting_scale(call, values, has_aux, optimizers, name):
    """``(result, gradients, optimizer, 1 / factor)``: ``jax.value_and_grad`` of ``call`` and its loss scale.

    For what needs the factor only after the backward pass (the guard's
    checks): it is noted in the pass itself, no second trace. ``gradients``
    has one entry per value; ``optimizer`` and the inverse are ``None`` when
    the loss was not scaled.
    """
    found = []
    noting = noting_scaler(call, optimizers, has_aux, name, found)

    def differentiated(*values):
        out = noting(*values)
        scaler, factor = found[-1]
        value, aux = out if has_aux else (out, None)
        return value, (aux, None if scaler is None else jax.lax.stop_gradient(1.0 / factor))

    grad_fn = jax.value_and_grad(differentiated, argnums=tuple(range(len(values))), has_aux=True)
    (value, (aux, inverse)), gradients = grad_fn(*values)
    return ((value, aux) if has_aux else value), list(gradients), found[-1][0], inverse


def inverse_scale_of(call, values, has_aux, optimizers):
    """1 / the factor ``call(*values)`` scaled the value it returns by (a float32 scalar)."""
    notes = []
    with noting_scaled_losses(optimizers, notes):
        out = call(*values)
    value = out[0] if has_aux else out
    factor = next(factor for _, scaled, factor in notes if scaled is value)
    return 1.0 / factor
