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
import threading

#: ``(id(operation), method) -> _Replaced`` while some block replaces it.
_ACTIVE = {}
_LOCK = threading.Lock()


class _Replaced:
    """One operation's replaced method: what to restore, and each open block's replacement."""

    def __init__(self, operation, method):
        self.had_own = method in operation.__dict__
        self.own = operation.__dict__.get(method)
        self.base = getattr(operation, method)  # what a thread without a block calls
        self.entries = []  # (thread, call), in the order the blocks entered

    def call_of(self, thread):
        """The call ``thread`` sees: its innermost replacement, else the operation's own."""
        return next((call for owner, call in reversed(tuple(self.entries)) if owner == thread), self.base)

    def dispatch(self, *args, **kwargs):
        return self.call_of(threading.get_ident())(*args, **kwargs)


@contextlib.contextmanager
def replaced_calls(replacements, method="call"):
    """Replaces ``call`` on each operation by ``make(its call)`` while the block runs; restores it on exit.

    Per thread: under ``tf.distribute.MirroredStrategy`` each replica traces
    the step in a thread of its own, and the threads take turns at each
    ``merge_call``, so two replicas' blocks interleave on the same layers. The
    instance attribute is then one dispatcher, which calls the replacement of
    the calling thread (its innermost), else the operation's own ``call``;
    the operation gets its own back when the last block exits, in whatever
    order the blocks exit.

    Args:
        replacements: ``(operation, make)`` pairs, ``make(original_call) -> call``.
        method: The method replaced, ``"call"`` unless the step to intercept is
            an inner one (an attention layer's ``_compute_attention``).
    """
    thread, entered = threading.get_ident(), []
    try:
        for operation, make in replacements:
            with _LOCK:
                replaced = _ACTIVE.get((id(operation), method))
                if replaced is None:
                    replaced = _ACTIVE[id(operation), method] = _Replaced(operation, method)
                    object.__setattr__(operation, method, replaced.dispatch)
                entry = (thread, make(replaced.call_of(thread)))
                replaced.entries.append(entry)
            entered.append((operation, entry))
        yield
    finally:
        with _LOCK:
            for operation, entry in reversed(entered):
                replaced = _ACTIVE[id(operation), method]
                replaced.entries.remove(entry)
                if replaced.entries:
                    continue
                del _ACTIVE[id(operation), method]
                if replaced.had_own:
                    object.__setattr__(operation, method, replaced.own)
                else:
                    del operation.__dict__[method]
