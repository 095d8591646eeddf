"""The guarded step, jitted with the spike rule's float buffers donated to it.

A step that does not donate its record makes XLA write every output array
afresh: the spike rule's window, rows, skips and samples, copied every step.
Donated (as Keras donates the model's state), the step writes its rows in
place. A donated buffer is deleted once the step that takes it is
dispatched, so a host read of the record (Keras' JAX batch ends may run in
another thread) holds the `kgrad.backends.jax.guard.run.GuardRun`'s lock, as
the dispatch does: it never meets a buffer the next step took. Only the float
buffers are donated: the flags the host keeps from older steps (``tripped``,
the count of skips) stay readable.

Example::

    step = donating(step_jit(model), guarded)  # guarded(state, record, data)
    logs, state, probe_records, record = step(state, record, data)
"""

from kgrad.backends.jax.guard.spike_record import joined, split_values


def donating(jit, guarded):
    """``guarded`` (``(state, record, data) -> (logs, state, probe records, record)``), jitted by ``jit``
    (`kgrad.backends.jax.handover.train_function.step_jit`'s) with the state and the spike rule's
    float buffers donated; ``guarded`` itself where steps are not jitted."""

    def split_call(state, buffers, record, data):
        return guarded(state, record._replace(spikes=joined(record.spikes, buffers)), data)

    jitted = jit(split_call, outputs=4, donate_argnums=(0, 1))
    if jitted is split_call:  # not jitted: nothing is donated
        return guarded

    def call(state, record, data):
        buffers, rest = split_values(record.spikes)
        return jitted(state, buffers, record._replace(spikes=rest), data)

    return call
