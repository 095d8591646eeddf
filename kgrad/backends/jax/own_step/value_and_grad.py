"""`kgrad.value_and_grad`: ``jax.value_and_grad`` that a `kgrad.GradientProbe` sees inside a model's own step.

Each call asks the active collection to differentiate (`active_parts`):
`activated` sets it while kgrad traces (or, without ``jit``, runs) a step for
a probed or guarded step (the probe's `kgrad.backends.jax.own_step.parts.PartCollection`,
the guard's `CheckedParts`, the replay's parts); ``None`` otherwise, so that
outside those steps it is exactly ``jax.value_and_grad``. JAX traces in the
thread that calls the function, so one variable per thread.
"""

import contextlib
import os
import threading

import jax

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


def value_and_grad(fn, argnums=0, has_aux=False, name=None):
    """``jax.value_and_grad(fn, argnums, has_aux)``, whose gradients a `kgrad.GradientProbe` logs.

    The JAX counterpart of `kgrad.ProbeTape` (TensorFlow): in a model's own
    ``train_step``, replace ``jax.value_and_grad`` with
    ``kgrad.value_and_grad``. Outside a step that a `kgrad.GradientProbe`
    probes it is exactly ``jax.value_and_grad``. On a probed step, the
    arrays differentiated (``argnums``) are matched, by identity, with the
    model's trainable variables in the step's ``state``: the smallest
    sub-model that holds them all is the one logged (``self.discriminator``,
    or the model itself), its layers' dJ/d(activation), its prediction's
    dJ/dŷ and the weight gradients, from the same backward pass. The
    gradients and values returned are ``jax.value_and_grad``'s.

    Under mixed precision, return the loss scaled by an optimizer of the
    model, ``self.optimizer.scale_loss(loss)`` (in a ``keras.StatelessScope``
    mapping the optimizer's variables to the step's), as the function's
    value: kgrad divides that factor back out, so what it logs is of the true
    loss. A function that scales a loss but returns another value is refused.

    Args:
        fn: The function to differentiate, as for ``jax.value_and_grad``.
        argnums: Which positional argument(s) to differentiate: an int or a
            tuple of ints.
        has_aux: Whether ``fn`` returns ``(value, auxiliary data)``.
        name: The run the gradients are logged under,
            ``<log_dir>/<name>/kgrad`` (``"generator"``); ``None``: the
            differentiated sub-model's name. A name used again in the same
            step gets ``#2``, ``#3``.

    Returns:
        A function with ``fn``'s arguments returning ``(value, gradients)``,
        or ``((value, aux), gradients)`` with ``has_aux``.

    Raises:
        TypeError, ValueError: For an argument of the wrong kind, naming it.

    Example:

    >>> import jax.numpy as jnp, kgrad
    >>> value, gradient = kgrad.value_and_grad(lambda w: jnp.sum(w ** 2))(jnp.arange(3.0))
    >>> float(value), gradient.tolist()
    (5.0, [0.0, 2.0, 4.0])
    """
    _check(fn, argnums, has_aux, name)

    def value_and_gradients(*args, **kwargs):
        parts = active_parts()
        if parts is None:
            return jax.value_and_grad(fn, argnums=argnums, has_aux=has_aux)(*args, **kwargs)
        return parts.value_and_grad(fn, argnums, has_aux, name, args, kwargs)

    return value_and_gradients


def _check(fn, argnums, has_aux, name):
    if not callable(fn):
        raise TypeError(
            f"kgrad.value_and_grad: `fn` must be the function to differentiate (a callable). "
            f"Received: fn={fn!r} of type {type(fn).__name__}."
        )
    numbers = argnums if isinstance(argnums, tuple) else (argnums,)
    if not numbers or not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        raise TypeError(
            "kgrad.value_and_grad: `argnums` must be an int or a non-empty tuple of ints, as for "
            f"jax.value_and_grad. Received: argnums={argnums!r}."
        )
    if not isinstance(has_aux, bool):
        raise TypeError(
            f"kgrad.value_and_grad: `has_aux` must be True or False. Received: has_aux={has_aux!r}."
        )
    if name is not None and (not isinstance(name, str) or not name or "/" in name or os.sep in name):
        raise ValueError(
            "kgrad.value_and_grad: `name` names the run the gradients are logged under "
            "(<log_dir>/<name>/kgrad): a non-empty string without '/', or None for the "
            f"sub-model's name. Received: name={name!r}."
        )
