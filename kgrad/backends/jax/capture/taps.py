"""Intercepting layer and op outputs inside a traced JAX step: Keras 3 has no hooks, so ``call`` is replaced.

While `intercept` is active, the ``call`` of the model and of each chosen
operation is replaced on the instance (and put back on exit, also on error),
as on TensorFlow: tracing is Python, so the replacement sees every call of
the traced step. Each float output goes through ``tap(name, kind, tensor)``,
which returns the tensor to use in its place (`kgrad.backends.jax.capture.carriers`).
The model's own call taps its float inputs (kind ``"input"``) and its
prediction (``"prediction"``); a layer called again is ``name#2``, a layer
with several float outputs ``name/0``, ``name/1``. `tap` (`kgrad.tap`) hands
any tensor inside a ``call()`` to the active taps, as an activation; outside a
traced probed step it returns the tensor, nothing else done.
"""

import contextlib
import threading

from keras import tree

from kgrad.backends.common.calls import replaced_calls
from kgrad.backends.common.model_io import is_float
from kgrad.backends.jax import keras_internals

# The Taps of the probed step being traced, innermost last. Tracing happens on
# the thread that calls the jitted function.
_ACTIVE = threading.local()


class Taps:
    """Names the calls of one traced pass and hands each float output to ``tap``.

    Args:
        tap: ``fn(name, kind, tensor) -> tensor``; ``kind`` is ``"activation"``,
            ``"input"`` or ``"prediction"``.
        keep: Optional ``fn(operation) -> bool``, asked when an operation has
            run (Keras has built it then): only kept operations are tapped.
    """

    def __init__(self, tap, keep=None):
        self._tap = tap
        self._keep = keep
        self.calls_per_name = {}
        self.non_float = {}
        self._model_called = False

    def _unique(self, name):
        count = self.calls_per_name.get(name, 0) + 1
        self.calls_per_name[name] = count
        return name if count == 1 else f"{name}#{count}"

    def layer_output(self, name, operation, outputs):
        if keras_internals.in_symbolic_scope() or (self._keep is not None and not self._keep(operation)):
            return outputs
        return self.tapped(name, outputs)

    def tapped(self, name, outputs):
        """``outputs`` of ``name`` (a layer, an op or a `kgrad.tap`), each float leaf tapped."""
        name = self._unique(name)
        leaves = tree.flatten(outputs)
        floats = [index for index, leaf in enumerate(leaves) if is_float(leaf)]
        if not floats:
            self.non_float[name] = [getattr(leaf, "dtype", type(leaf)) for leaf in leaves]
            return outputs
        for position, index in enumerate(floats):
            key = name if len(floats) == 1 else f"{name}/{position}"
            leaves[index] = self._tap(key, "activation", leaves[index])
        return tree.pack_sequence_as(outputs, leaves)

    def model_inputs(self, inputs):
        if self._model_called or keras_internals.in_symbolic_scope():
            return inputs
        return tree.map_structure(
            lambda leaf: self._tap(None, "input", leaf) if is_float(leaf) else leaf, inputs
        )

    def model_outputs(self, outputs):
        if self._model_called or keras_internals.in_symbolic_scope():
            return outputs
        self._model_called = True  # the first call is the step's; later ones (a metric's) are not
        return tree.map_structure(
            lambda leaf: self._tap(None, "prediction", leaf) if is_float(leaf) else leaf, outputs
        )


@contextlib.contextmanager
def intercept(model, operations_by_name, taps):
    """Routes the outputs of ``model`` and of ``operations_by_name`` through ``taps`` while the block runs."""
    def layer_wrapper(name, operation):
        def wrap(original_call):
            def call(*args, **kwargs):
                return taps.layer_output(name, operation, original_call(*args, **kwargs))

            return call

        return wrap

    def model_wrapper(original_call):
        def call(*args, **kwargs):
            if args:
                args = (taps.model_inputs(args[0]),) + args[1:]
            return taps.model_outputs(original_call(*args, **kwargs))

        return call

    replacements = [(model, model_wrapper)]
    replacements += [(op, layer_wrapper(name, op)) for name, op in operations_by_name.items()]
    with replaced_calls(replacements), _active(taps):  # kgrad.tap calls reach taps too
        yield taps


class KeyedTaps(Taps):
    """`Taps` whose inputs and predictions get keys of their own (``input:0``, ``prediction:0``).

    With ``tap_inputs=False`` the inputs are passed on untapped (a part of a
    model's own ``train_step``, whose inputs are another part's outputs).
    """

    def __init__(self, tap, keep, tap_inputs=True):
        self._counts = {}

        def keyed(name, kind, tensor):
            if kind == "input" and not tap_inputs:
                return tensor
            if name is None:
                index = self._counts.get(kind, 0)
                self._counts[kind] = index + 1
                name = f"{kind}:{index}"
            return tap(name, kind, tensor)

        super().__init__(keyed, keep)


def union_selection(*selections):
    """``(operations by name, keep)`` that taps what any of ``selections`` taps.

    Each selection is a pair of `kgrad.plan.selection.resolve_selection`: a
    pass tapping for two users (the probe and the guard's ``watch=``) taps
    each operation either keeps; each user's tap passes the others' keys on.
    """
    operations, kept_by = {}, []
    for chosen, keep in selections:
        operations.update(chosen)
        kept_by.append(({id(op) for op in chosen.values()}, keep))

    def keep(operation):
        return any(id(operation) in ids and (k is None or k(operation)) for ids, k in kept_by)

    return operations, keep


@contextlib.contextmanager
def _active(taps):
    """Makes ``taps`` receive `tap` calls while the block runs."""
    stack = _ACTIVE.__dict__.setdefault("stack", [])
    stack.append(taps)
    try:
        yield taps
    finally:
        stack.pop()


def tap(name, x):
    """`kgrad.tap` on JAX: ``x`` through the active taps of the probed step being traced, if any.

    Inside such a step, each float leaf comes back through the identity whose
    backward pass takes dJ/dx's statistics (`Taps.tapped`); outside one, or
    while Keras builds the model symbolically, ``x`` itself.

    Example:

    >>> import jax.numpy as jnp
    >>> x = jnp.ones(3)
    >>> tap("hidden", x) is x  # no probed step is being traced
    True
    """
    stack = getattr(_ACTIVE, "stack", None)
    if not stack or keras_internals.in_symbolic_scope():
        return x
    return stack[-1].tapped(name, x)
