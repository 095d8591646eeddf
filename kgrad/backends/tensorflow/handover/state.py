"""The device-side buffer through which probed summaries reach the host.

The probing step writes each probed step's summaries into a small ring buffer
of variables; the host reads it only on steps it knows were probed, so steps
that do not log never read device memory. Each record carries its
``optimizer.iterations`` step and a sequence number, so that with
``steps_per_execution=k`` every probed step of an execution is delivered once.
A train function that probes every step also returns the record it wrote
with its outputs (`RECORD_OUTPUT`); when that is the one new record, the
host takes it from there and the buffer is not read.
"""


import numpy as np
import tensorflow as tf

from kgrad.backends.tensorflow.handover.replicas import state_variable
from kgrad.logs.record import ProbeRecord

#: The key under which a train function that probes every step returns the
#: record it wrote (`ProbeState.write`'s result), so that the host gets it
#: with the outputs Keras reads anyway instead of reading the buffer.
RECORD_OUTPUT = "kgrad_record"


class ProbeState:
    """A ring buffer of probed summaries, in device variables.

    Args:
        capacity: How many probed steps can wait for the host to read them
            (the most probed steps one execution can hold).
        scalar_names: Tags of the scalar summaries, in vector order.
        histogram_names: Tags of the histograms, in tensor order.
        bucket_count: Buckets per histogram.
    """

    def __init__(self, capacity, scalar_names, histogram_names, bucket_count):
        self.capacity = capacity
        self.scalar_names = tuple(scalar_names)
        self.histogram_names = tuple(histogram_names)
        self.bucket_count = bucket_count
        self.written = state_variable(tf.constant(0, tf.int64), "kgrad_written")
        self.steps = state_variable(tf.fill([capacity], tf.constant(-1, tf.int64)), "kgrad_steps")
        self.scalars = state_variable(tf.zeros([capacity, len(self.scalar_names)]), "kgrad_scalars")
        self.histograms = state_variable(
            tf.zeros([capacity, len(self.histogram_names), bucket_count, 3]), "kgrad_histograms"
        )

    def write(self, step, scalars, histograms, where=None):
        """Stores one probed step (graph code; runs inside the train step).

        With ``where`` (a scalar bool tensor), the write happens only where it
        is true, without a branch (for multi-replica steps).

        Returns:
            ``(written, step, scalars, histograms)``: the record as written,
            after how many records were written in all (its sequence number
            plus one), which `read_since` takes as ``latest``.
        """
        slot = tf.math.floormod(self.written, self.capacity)
        index = tf.reshape(slot, [1, 1])
        # Whole-buffer assigns (the buffers are small): distributed variables
        # support `assign` in a replica, not `scatter_nd_update`.
        _assign_row(self.steps, index, tf.reshape(tf.cast(step, tf.int64), [1]), where)
        # A scatter into an empty variable (no scalars, or histograms=False)
        # fails to build, so empty buffers are left alone.
        if self.scalar_names:
            _assign_row(self.scalars, index, scalars[tf.newaxis], where)
        if self.histogram_names:
            _assign_row(self.histograms, index, histograms[tf.newaxis], where)
        written = tf.convert_to_tensor(
            self.written.assign_add(1 if where is None else tf.cast(where, tf.int64))
        )
        return written, tf.cast(step, tf.int64), scalars, histograms

    @tf.function(autograph=False)
    def _read_all(self):
        return (
            self.written.read_value(),
            self.steps.read_value(),
            self.scalars.read_value(),
            self.histograms.read_value(),
        )

    def reset(self):
        """Empties the buffer (for a new ``fit``); ``read_since(0)`` then returns nothing."""
        self.written.assign(0)
        self.steps.assign(tf.fill(tf.shape(self.steps), tf.constant(-1, tf.int64)))

    def read_since(self, delivered, latest=None):
        """Returns the records written after the first ``delivered`` ones.

        This reads device memory: call it only on steps that log.

        Args:
            delivered: How many records the caller has already.
            latest: What `write` returned for the latest record, as outputs
                of the train function that wrote it (``None`` if unknown).
                When it is the only new record, or there is none, the buffer
                is not read: one function call less per logged step.

        Returns:
            ``(records, written)``: the new `ProbeRecord`s in order, and the
            total number written so far (pass it back as ``delivered``).
        """
        if latest is not None:
            written = int(latest[0].numpy())
            if written == delivered:
                return [], delivered
            if written == delivered + 1:
                return [self._record(*(value.numpy() for value in latest[1:]))], written
        # One call for the four buffers: a variable's `.numpy()` is an eager
        # op of its own (~70 µs), and this runs after every probed step.
        written, steps, scalars, histograms = (value.numpy() for value in self._read_all())
        written = int(written)
        if written == delivered:
            return [], written
        first = max(delivered, written - self.capacity)
        records = []
        for sequence in range(first, written):
            slot = sequence % self.capacity
            records.append(self._record(steps[slot], scalars[slot], histograms[slot]))
        return records, written

    def _record(self, step, scalars, histograms):
        return ProbeRecord(
            step=int(step),
            # Python floats in one call; one copy of the record's
            # histograms, of which each tag gets a view.
            scalars=dict(zip(self.scalar_names, scalars.tolist())),
            histograms=dict(zip(self.histogram_names, np.array(histograms))),
        )


def _assign_row(variable, index, rows, where=None):
    updated = tf.tensor_scatter_nd_update(variable.value(), index, rows)
    if where is not None:
        updated = tf.where(where, updated, variable.value())
    variable.assign(updated)
