"""What the host reads of the JAX guard's spike records: whether a step was skipped, and its snapshot.

One `kgrad.backends.jax.guard.spikes.SpikeRecord` for Keras' step, or one
per part of a model's own step (`kgrad.backends.jax.guard.part_spikes`).
A clean step reads nothing: `SpikeReads.news` reads the count of skips only
once the device has computed it, never waiting for it.

Example:

>>> import jax.numpy as jnp
>>> reads = SpikeReads()
>>> reads.news((jnp.asarray(0), jnp.asarray(1)))
True
"""

import jax

from kgrad.plan.spike_rule import SpikeSnapshot


def skip_counts(spikes, per_part):
    """The device's count of skipped steps (a tuple, one per part, where ``per_part``), or ``None``."""
    if spikes is None:
        return None
    return tuple(part.skip_count for part in spikes) if per_part else spikes.skip_count


class SpikeReads:
    """The skips read so far, per record (``None``: Keras' step's; a part's number)."""

    def __init__(self):
        self._seen = {}

    def news(self, counts):
        """Whether ``counts`` (`skip_counts`) say a skip not read yet (reads computed scalars only)."""
        if counts is None:
            return False
        counts = counts if isinstance(counts, tuple) else (counts,)
        if not all(count.is_ready() for count in counts):
            return False
        return sum(int(count) for count in counts) > sum(self._seen.values())

    def snapshot(self, key, spikes, weights, adam_reason):
        """Host side (waits for the step): the `SpikeSnapshot` of the record ``spikes``, noted as read."""
        spikes = jax.device_get(spikes)
        self._seen[key] = int(spikes.skip_count)
        return SpikeSnapshot(
            rows=spikes.rows, row_count=int(spikes.row_count), skip_values=spikes.skip_values,
            skip_steps=spikes.skip_steps, skip_count=int(spikes.skip_count), tripped=bool(spikes.tripped),
            weights=weights, adam_reason=adam_reason,
        )
