"""Replaying a tripped own JAX ``train_step``: where, inside which part, its first NaN/Inf was born.

The user's ``train_step`` runs once more, eagerly, from the state the guard
kept, on the step's own batch, with a `_ReplayedParts` active: each
`kgrad.value_and_grad` call (a part) differentiates its function with the
layers and ``keras.ops`` nodes of its sub-model checked forward and backward
(the `kgrad.backends.jax.guard.trace` recorder: a zero perturbation per
output, whose gradient is dJ/d(output)), and `kgrad.backends.jax.guard.locate`
names where the NaN was born. The first part whose pass is not finite is the
one named (later parts would only see what it made); the replay stops there.
The step's updates are computed and dropped: the model's variables are only read.
A loss an optimizer's ``scale_loss`` would scale (mixed precision) is replayed
unscaled, as on TensorFlow: an overflow of the scaled float16 gradients is the
loss scaler's signal, not where a NaN was born.
"""

import contextlib

import jax
import keras

from kgrad.backends.common.batch_dump import is_dump, unpack_batch
from kgrad.backends.common.loss_scale import scales_loss
from kgrad.backends.common.own_step import candidate_optimizers
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.guard import locate, trace
from kgrad.backends.jax.own_step.resolve import PartResolver, bind_differentiated
from kgrad.backends.jax.own_step.value_and_grad import activated
from kgrad.plan import selection


class _Found(Exception):
    """Stops the replayed step at the part where the NaN was born."""


def replay_own_step(model, batch):
    """``(born fields or None, note)`` of one replayed own ``train_step`` (see the module)."""
    x, y, sample_weight = unpack_batch(batch)
    born = locate.before_the_pass(model, x, y, sample_weight)
    if born is not None:
        return born, None
    data = keras.utils.pack_x_y_sample_weight(x, y, sample_weight) if is_dump(batch) else batch
    state = keras_internals.jax_state(model)
    parts = _ReplayedParts(model, state[0])
    with activated(parts), _unscaled_losses(model) as scaling:
        try:
            model.train_step(state, data)
        except _Found:
            pass
    if parts.born is None and scaling:
        return None, _UNSCALED_NOTE
    return parts.born, None


class _ReplayedParts:
    """The `kgrad.value_and_grad` calls of the replayed step, each checked layer by layer."""

    def __init__(self, model, trainable):
        self._resolver = PartResolver(model, trainable)
        self.born = None

    def value_and_grad(self, fn, argnums, has_aux, name, args, kwargs):
        resolved = self._resolver.resolve(argnums, args)
        part = self._resolver.run_name(resolved, name)
        born = _checked_pass(resolved.owner, fn, resolved.numbers, has_aux, args, kwargs, resolved.paths)
        if born is not None:
            self.born = {
                **born, "born_at": f"{part}/{born['born_at']}", "born_path": f"{part}/{born['born_path']}",
                "replay_note": " ".join(filter(None, [
                    born.get("replay_note"),
                    f"Replayed kgrad.value_and_grad {part!r} of the model's own train_step (eagerly, from "
                    "the state the guard kept): the names are paths inside that part.",
                ])),
            }
            raise _Found
        return jax.value_and_grad(fn, argnums=argnums, has_aux=has_aux)(*args, **kwargs)


def _checked_pass(owner, fn, numbers, has_aux, args, kwargs, paths):
    """The ``born_*`` fields of one part's pass with its layers checked, or ``None`` if it was finite."""
    part_call, differentiated = bind_differentiated(fn, numbers, args, kwargs)

    def read(out, calls):
        value = out[0] if has_aux else out
        return value, value, calls[-1].outputs if calls else []

    operations = selection.resolve_layers(owner, "all")
    calls, arrays = trace.replayed_pass(owner, operations, part_call, differentiated, read)
    return locate.located(owner, calls, arrays, paths)


_UNSCALED_NOTE = (
    "The replay differentiated the true loss, unscaled (as on TensorFlow): the scaled float16 "
    "gradients overflowing is the loss scaler's signal, which it answers by skipping the step and "
    "lowering its scale. NonFiniteGuard(ignore_loss_scale_skips=True), the default, leaves those "
    "steps to it."
)


@contextlib.contextmanager
def _unscaled_losses(model):
    """While the block runs, each optimizer of ``model`` that scales losses returns them unscaled."""
    scaling = [optimizer for optimizer in candidate_optimizers(model) if scales_loss(optimizer)]
    for optimizer in scaling:
        object.__setattr__(optimizer, "scale_loss", lambda loss: loss)
    try:
        yield scaling
    finally:
        for optimizer in scaling:
            optimizer.__dict__.pop("scale_loss", None)

