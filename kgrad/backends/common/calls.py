"""Keras 3 has no layer hooks: a layer's ``__call__`` ends in ``self.call(...)``, so kgrad replaces ``call``.

Replacing it on the *instance* (and restoring it) intercepts the outputs of
layers in Sequential, Functional and subclassed models alike, and of the
non-layer operations of a Functional model (``keras.ops.sin`` becomes an
operation named ``sin``), on every backend: tracing is Python.

Example:

>>> import keras
>>> layer = keras.layers.Dense(1)
>>> seen = []
>>> def record(call):
...     def recorded(*args, **kwargs):
...         seen.append("dense")
...         return call(*args, **kwargs)
...     return recorded
>>> with replaced_calls([(layer, record)]):
...     _ = layer(keras.ops.ones((1, 2)))
>>> seen, "call" in layer.__dict__
(['dense'], False)
"""

import contextlib


@contextlib.contextmanager
def replaced_calls(replacements, method="call"):
    """Replaces ``call`` on each operation by ``make(its call)`` while the block runs; restores it on exit.

    Args:
        replacements: ``(operation, make)`` pairs, ``make(original_call) -> call``.
        method: The method replaced, ``"call"`` unless the step to intercept is
            an inner one (an attention layer's ``_compute_attention``).
    """
    replaced = []
    try:
        for operation, make in replacements:
            had_own_call = method in operation.__dict__
            original = operation.__dict__.get(method)
            object.__setattr__(operation, method, make(getattr(operation, method)))
            replaced.append((operation, had_own_call, original))
        yield
    finally:
        for operation, had_own_call, original in reversed(replaced):
            if had_own_call:
                object.__setattr__(operation, method, original)
            else:
                del operation.__dict__[method]
