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

from kgrad.logs.event_file import EventFile
from kgrad.logs.summary_bytes import scalar_proto
from kgrad.logs.writer import described_entry


class SpikeEvents:
    """An event file in ``run_dir``, created on the first write.

    Args:
        run_dir: The run folder (``<log_dir>/kgrad``, or a part's folder in it).
    """

    def __init__(self, run_dir):
        self.run_dir = run_dir
        self._events = None
        self._described = set()

    def write(self, step, scalars):
        """Writes ``{tag: value}`` at ``step``; each tag's description with its first value."""
        if not scalars:
            return
        if self._events is None:
            self._events = EventFile(self.run_dir)
        summary = summary_pb2.Summary()
        for tag, value in scalars.items():
            entry = described_entry(summary, tag, scalar_metadata, self._described)
            entry.tensor.CopyFrom(scalar_proto(value))
        self._events.write_summary(summary.SerializeToString(), step)

    def flush(self):
        if self._events is not None:
            self._events.flush()

    def close(self):
        if self._events is not None:
            self._events.close()
            self._events = None
