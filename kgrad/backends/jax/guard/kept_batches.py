"""The batches of a JAX guard's latest steps, kept (no copy) until the device says they were clean.

Keras' JAX loop dispatches steps ahead of the device, and the guard reads
its flag in another thread (`async_safe`), possibly several executions
later: a batch is let go once its step's flag is computed (``is_ready``,
which does not wait) and clear, so the batch of a trip is still here
whenever it is read (`kgrad.backends.jax.guard.run.GuardRun.tripped_batch`).

Example:

>>> import jax.numpy as jnp
>>> kept = KeptBatches()
>>> for batch in ("a", "b", "c"):
...     _ = kept.keep(batch, jnp.asarray(batch == "b"), steps_per_execution=1)
>>> kept.get(1)
'b'
"""


class KeptBatches:
    """The batches of the steps whose flags were not yet seen clean, by batch index in the epoch."""

    def __init__(self):
        self.restart()

    def restart(self):
        """Forgets every batch: an epoch starts (indices from 0), or what follows a trip is kept afresh."""
        self._next, self._batches = 0, {}

    def keep(self, data, tripped, steps_per_execution):
        """Keeps ``data``, the batch of the step whose flag is ``tripped``; lets go of older clean ones.

        Returns:
            Whether an older step's flag, read, says it tripped (at most two flags are read a
            step, each a scalar already computed).
        """
        self._batches[self._next] = (data, tripped)
        self._next += 1
        for batch in list(self._batches)[:2]:  # oldest first
            flag = self._batches[batch][1]
            if batch >= self._next - steps_per_execution or not flag.is_ready():
                return False
            if bool(flag):  # the trip's batch (or one after it): kept
                return True
            del self._batches[batch]
        return False

    def get(self, batch):
        """The batch kept for index ``batch``, or ``None``."""
        kept = self._batches.get(batch)
        return None if kept is None else kept[0]
