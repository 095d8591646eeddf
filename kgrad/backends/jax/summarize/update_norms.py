"""‖w‖ and ‖Δw‖ of a weight and its update, read once: ``weight_norm/``, ``update_ratio/``, ``update_rms/``.

The probe writes ``weight_norm/`` and ``update_ratio/`` of a weight
(`kgrad.backends.jax.capture.probe_taps.add_weight_rows`) and, with
``instruments=["optimizer"]``, ``update_rms/`` = ‖Δw‖ / √n
(`kgrad.backends.jax.summarize.instruments.add_optimizer_rows`). All three
come from one read of the weight before and after its update: the optimizer
instrument takes ‖Δw‖ from the weights' rows where they have it. When it
read ``after - before`` a second time, apart, XLA wrote that change out
whole: on an MLP 1024-2048-1024 under ``DataParallel`` on 8 CPU devices,
16.8 MB more per device (docs/sharded.md).

Example:

>>> import jax.numpy as jnp
>>> norm, change = weight_and_change_norms(jnp.array([3.0, 4.0]), jnp.array([3.0, 1.0]))
>>> float(norm), float(change), round(float(update_ratio(norm, change)), 4)
(5.0, 3.0, 0.6)
"""

import jax.numpy as jnp

from kgrad.backends.jax.summarize.compiled import compiled_on_its_own
from kgrad.backends.jax.summarize.on_device import reducible
from kgrad.backends.jax.summarize.one_pass import norm_from_sums, norm_parts, reduce_in_one_pass


@compiled_on_its_own
def weight_and_change_norms(weight, updated):
    """``(‖w‖, ‖Δw‖)`` of a weight before and after its update, in one read of both.

    With a read each and a max pass first, the change and the weight over its
    largest magnitude were written out whole, the size of the weights. The
    norms neither overflow nor underflow (`one_pass`).
    """
    before_update = reducible(weight.astype(jnp.float32))
    moved = reducible(updated.astype(jnp.float32)) - before_update
    totals = reduce_in_one_pass(*norm_parts(before_update), *norm_parts(moved))
    return norm_from_sums(*totals[:3]), norm_from_sums(*totals[3:])


def update_ratio(norm, change):
    """‖Δw‖ / ‖w‖; 1 for a weight that was all zeros (a bias at step 0), which moved by all of its change."""
    return jnp.where(norm > 0, change / jnp.where(norm > 0, norm, 1.0), change > 0)
