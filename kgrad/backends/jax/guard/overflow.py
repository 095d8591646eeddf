"""A ``LossScaleOptimizer``'s overflowing gradients inside the guard's check (JAX): its own, never a trip.

With spike skipping under loss scaling (``ignore_loss_scale_skips``, the
default), a part's weight gradients are rows of the spike rule that the
check leaves out: scaled gradients that overflow are how the optimizer finds
its scale, and it skips that step's update itself (its ``stateless_apply``
returns the values it was given, with a lower scale): `sentinel.tensor_checks`
counts no NaN/Inf of them (``unchecked``). The spike rule neither
judges such a step nor lets it into its window (`spikes.after_step`). The
TensorFlow counterpart is `kgrad.backends.tensorflow.guard.overflow`.

Example:

>>> import jax.numpy as jnp
>>> bool(overflowed(jnp.array([1.0, jnp.inf]), True)), overflowed(jnp.array([1.0]), False)
(True, None)
"""

import jax.numpy as jnp


def overflowed(gradient_squares, owned):
    """Whether a loss scaler's gradients overflowed: a sum of squares of ``gradient_squares`` not
    finite; ``None`` where the gradients are not ``owned`` (not a loss scaler's rows)."""
    if not owned:
        return None
    return jnp.logical_not(jnp.all(jnp.isfinite(gradient_squares)))


def gradients_finite(counts, overflowed):
    """Whether every checked element is finite: no NaN/Inf in ``counts`` (`sentinel.tensor_checks`'s,
    0 for a loss scaler's rows) and no loss scaler's gradients ``overflowed`` (or ``None``)."""
    finite = jnp.logical_not(jnp.any(counts > 0))
    return finite if overflowed is None else finite & jnp.logical_not(overflowed)
