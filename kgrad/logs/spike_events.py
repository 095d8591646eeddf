"""Scalars of the guard's spike rule, written to their own event file (`kgrad.callbacks.spike_log`).

Their own file in the run folder: the probe's `kgrad.logs.writer.ProbeWriter`
writes the Custom Scalars layout of the run, which TensorBoard reads once.

Example:

>>> import tempfile
>>> events = SpikeEvents(tempfile.mkdtemp())
>>> events.write(3, {"global/step_skipped": 1.0})
>>> events.close()
"""

from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata

from kgrad.logs.summary_bytes import scalar_proto
from kgrad.logs.writer import EventFileOnWrite, described_entry


class SpikeEvents(EventFileOnWrite):
    """An event file in ``run_dir``, created on the first write.

    Args:
        run_dir: The run folder (``<log_dir>/kgrad``, or a part's folder in it).
    """

    def write(self, step, scalars):
        """Writes ``{tag: value}`` at ``step``; each tag's description with its first value."""
        if not scalars:
            return
        events = self.events()
        summary = summary_pb2.Summary()
        for tag, value in scalars.items():
            entry = described_entry(summary, tag, scalar_metadata, self.described)
            entry.tensor.CopyFrom(scalar_proto(value))
        events.write_summary(summary.SerializeToString(), step)
