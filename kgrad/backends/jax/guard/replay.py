"""Replaying a tripped JAX step to name the layer or op where its first NaN/Inf was born.

The guard's every-step check (the loss and the weight gradients) says *that*
a step went non-finite. On a trip, `replay_fields` runs the step's own batch
once more from the state the guard kept (the weights, the BatchNormalization
statistics and the seed generators of before the bad update: a random layer
draws what the step drew), under ``jit`` when the model's steps are jitted,
with every layer, nested layer and ``keras.ops`` node checked forward and
backward (`kgrad.backends.jax.guard.trace`), and the rules of
`kgrad.backends.common.locate` name where it was born (`kgrad.replay_step`,
`kgrad.backends.common.replay_step`, asks `replay_fields`).
``jax.experimental.checkify`` with its float checks runs the same pass once
more and names the JAX primitive and the line of
the model's code that made the first NaN/Inf; its words go in the report's
``replay_note``. Nothing is applied: the model's variables are only read.

With several JAX processes (``jax.distributed``) every process trips at the
same step (they read the same replicated flag) and runs the replay together,
as one program over the mesh: the batch is the global array Keras fed the
step (`_global` makes one from each process's part of a batch given to
`kgrad.replay_step`), the weights are the sharded ones kept, and only counts
and ranges reduced on the devices, replicated, come back to each host
(`kgrad.backends.jax.guard.device_reads`); each process applies the same rules.

A model with its own ``train_step`` is replayed part by part (`replay_own_step`):
the step runs once more, eagerly (with several processes, each op one program
over the mesh, run by every process in the same order), with a `_ReplayedParts` active, each
`kgrad.value_and_grad` call (a part) differentiating its function in the
same checked pass over its sub-model. The first part whose pass is not finite
is the one named (later parts would only see what it made); the replay stops
there. A loss an optimizer's ``scale_loss`` would scale (mixed precision) is
replayed unscaled, as on TensorFlow: an overflow of the scaled float16
gradients is the loss scaler's signal, not where a NaN was born.
"""

import os

import jax
import keras
import numpy as np
from jax.experimental import checkify

from kgrad.backends.common.batch_dump import is_dump, unpack_batch
from kgrad.backends.common.calls import replaced_calls
from kgrad.backends.common.loss_scale import scales_loss
from kgrad.backends.common.model_io import model_relative_path
from kgrad.backends.common.own_step import candidate_optimizers, has_own_train_step
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.guard import trace
from kgrad.backends.jax.own_step.resolve import PartResolver, bind_differentiated
from kgrad.backends.jax.own_step.value_and_grad import activated
from kgrad.plan import selection

# Frames of these packages are not the model's own code (checkify's line).
_LIBRARIES = tuple(
    os.path.dirname(module.__file__) + os.sep for module in (jax, keras, __import__("kgrad"))
)


def replay_fields(model, batch, seeds_after=None):
    """Runs one training step's forward and backward pass again and names where its NaN was born.

    Args:
        model: The model, at the state the guard kept (before the bad update).
        batch: The step's data ``(x, y[, sample_weight])``, or a dumped ``.npz``'s dict.
        seeds_after: Unused on JAX: the seed generators' state is part of the
            state the guard kept, so the replay draws what the step drew.

    Returns:
        ``(born, note)``: the ``born_*`` fields (``None`` if the replay was
        finite), and the primitive and source line ``checkify`` names.
    """
    del seeds_after
    processes = jax.process_count()
    if has_own_train_step(model):  # its kgrad.value_and_grad calls, each part checked
        return replay_own_step(model, batch)
    x, y, sample_weight = (_global(_as_fed(part)) for part in unpack_batch(batch))
    born = trace.before_the_pass(model, x, y, sample_weight)
    if born is not None:
        return born, None
    operations = selection.resolve_layers(model, "all")
    # With several processes the replay is one program over the mesh, jitted (as tested) whatever fit ran.
    jit = (model.jit_compile and not model.run_eagerly) or processes > 1
    calls, arrays = trace.trace_step(model, operations, x, y, sample_weight, jit=jit)
    paths = [model_relative_path(model, weight) for weight in model.trainable_variables]
    born = trace.located(model, calls, arrays, paths)
    if born is None:
        return None, None
    return born, _checkify_note(model, x, y, sample_weight, jit)


def _as_fed(structure):
    """NumPy float64 leaves in Keras' float type, as ``fit``'s data adapters feed them."""
    def cast(leaf):
        if isinstance(leaf, np.ndarray) and leaf.dtype == np.float64:
            return leaf.astype(keras.backend.floatx())
        return leaf

    return None if structure is None else keras.tree.map_structure(cast, structure)


def _global(structure):
    """``structure``'s leaves as global arrays, with several processes and a ``keras.distribution``.

    Each leaf held by this process alone is its part of the global batch,
    laid out as Keras lays out a batch it feeds a step. The guard keeps the
    step's batch as Keras fed it, already global; `kgrad.replay_step` may be
    given each process's part, as ``fit`` is.
    """
    distribution = keras.distribution.distribution()
    if structure is None or distribution is None or jax.process_count() == 1:
        return structure

    def place(leaf):
        if leaf is None or (isinstance(leaf, jax.Array) and not leaf.is_fully_addressable):
            return leaf  # already global
        leaf = np.asarray(leaf)  # this process's part (its own devices' arrays included)
        layout = distribution.get_data_layout(leaf.shape).backend_layout
        return jax.make_array_from_process_local_data(layout, leaf)

    return keras.tree.map_structure(place, structure)


def _checkify_note(model, x, y, sample_weight, jit):
    """What ``jax.experimental.checkify`` (float checks) says of the same pass, or ``None``."""
    try:
        step, trainable, given = trace.checked_function(model, x, y, sample_weight)
        checked = checkify.checkify(jax.jit(step) if jit else step, errors=checkify.float_checks)
        error, _ = checked(trainable, given)
        message = error.get()
        if message is None:
            return None
        where = _model_line(getattr(error.get_exception(), "traceback_info", None))
    except Exception as failure:  # noqa: BLE001 - the located layer stands without it
        return f"(jax.experimental.checkify could not name the primitive: {type(failure).__name__}.)"
    return f"jax.experimental.checkify (float checks) says: {message.rstrip('.')}{where}."


def _model_line(traceback):
    """``, at file:line (function)`` of the innermost frame outside JAX, Keras and kgrad, or ``""``."""
    for frame in getattr(traceback, "frames", None) or ():
        if not frame.file_name.startswith(_LIBRARIES):
            return f", at {frame.file_name}:{frame.line_num} ({frame.function_name})"
    return ""


class _Found(Exception):
    """Stops the replayed step at the part where the NaN was born."""


def replay_own_step(model, batch):
    """``(born fields or None, note)`` of one replayed own ``train_step`` (see the module's docstring)."""
    x, y, sample_weight = unpack_batch(batch)
    data = keras.utils.pack_x_y_sample_weight(x, y, sample_weight) if is_dump(batch) else batch
    # With several processes: global arrays, every process running the step's ops together.
    data = _global(data)
    x, y, sample_weight = unpack_batch(data)
    born = trace.before_the_pass(model, x, y, sample_weight)
    if born is not None:
        return born, None
    state = keras_internals.jax_state(model)
    parts = _ReplayedParts(model, state[0])
    # Each optimizer that scales losses returns them unscaled while the step runs.
    scaling = [optimizer for optimizer in candidate_optimizers(model) if scales_loss(optimizer)]
    unscaled = [(optimizer, lambda scale_loss: lambda loss: loss) for optimizer in scaling]
    with activated(parts), replaced_calls(unscaled, method="scale_loss"):
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
    return trace.located(owner, calls, arrays, paths)


_UNSCALED_NOTE = (
    "The replay differentiated the true loss, unscaled (as on TensorFlow): the scaled float16 "
    "gradients overflowing is the loss scaler's signal, which it answers by skipping the step and "
    "lowering its scale. NonFiniteGuard(ignore_loss_scale_skips=True), the default, leaves those "
    "steps to it."
)
