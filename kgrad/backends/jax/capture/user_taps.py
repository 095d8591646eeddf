"""`kgrad.tap` on JAX: marks any tensor inside a ``call()`` for capture by the probed step being traced.

While a probed step is traced, `kgrad.backends.jax.capture.taps.intercept` makes
its `Taps` the active ones; ``tap(name, x)`` hands ``x`` to them as an
activation, so that its statistics and those of dJ/dx (through a carrier, in
the same backward pass) are logged under ``name``, as on TensorFlow. Steps
that do not probe, and any call outside a traced step, get ``x`` back with
nothing else done.
"""

import contextlib
import threading

from kgrad.backends.jax import keras_internals
from kgrad.plan.options import check_tap_name

# The Taps of the probed step being traced, innermost last. Tracing happens on
# the thread that calls the jitted function.
_ACTIVE = threading.local()


@contextlib.contextmanager
def active(taps):
    """Makes ``taps`` receive `tap` calls while the block runs."""
    stack = _ACTIVE.__dict__.setdefault("stack", [])
    stack.append(taps)
    try:
        yield taps
    finally:
        stack.pop()


def tap(name, x):
    """Marks a tensor inside a model's ``call()`` for capture by a probe.

    Returns ``x``: the tensor itself, or inside a probed step the tensor
    through the identity whose backward pass takes dJ/dx's statistics. When no
    probed step is being traced, ``tap`` does nothing else, so it can stay in a
    model permanently at no cost. On JAX the probed steps are those of
    `kgrad.GradientProbe` (Keras' own ``train_step``) and of a model's own
    ``train_step`` that differentiates with `kgrad.value_and_grad`.

    Args:
        name: The name the tensor is reported under (``str``). A name tapped
            several times in one forward pass is reported as ``name``,
            ``name#2``, ``name#3``...
        x: A float tensor (or a nested structure of tensors).

    Returns:
        ``x``, or in a probed step the same values, tapped.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> class Block(keras.Model):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.dense = keras.layers.Dense(1)
    ...     def call(self, x):
    ...         return self.dense(kgrad.tap("doubled", x * 2.0))
    >>> model = Block()
    >>> model.compile("sgd", "mse")
    >>> probe = kgrad.GradientProbe(every_n_steps=1)
    >>> _ = model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0, callbacks=[probe])
    >>> "grad_norm/doubled" in probe.latest.scalars
    True
    """
    check_tap_name(name)
    stack = getattr(_ACTIVE, "stack", None)
    if not stack or keras_internals.in_symbolic_scope():
        return x
    return stack[-1].tapped(name, x)
