"""Which probed step is being traced: what `kgrad.value_and_grad` asks to know whether to probe.

Set by `kgrad.backends.jax.own_step.train_function` while it traces (or,
without ``jit``, runs) a model's own ``train_step`` for a probed step, and
read by `kgrad.value_and_grad` when the step calls it; ``None`` otherwise,
so that outside a probed step it is exactly ``jax.value_and_grad``. JAX
traces in the thread that calls the function, so one variable per thread.
"""

import contextlib
import threading

_ACTIVE = threading.local()


def active_parts():
    """The `kgrad.backends.jax.own_step.parts.PartCollection` of the step being traced, or ``None``."""
    return getattr(_ACTIVE, "parts", None)


@contextlib.contextmanager
def activated(parts):
    """Makes ``parts`` the active collection while the block runs (restores the previous one on exit)."""
    previous = active_parts()
    _ACTIVE.parts = parts
    try:
        yield parts
    finally:
        _ACTIVE.parts = previous
