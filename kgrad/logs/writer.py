"""What kgrad writes to TensorBoard: the Summary of each probed step.

Records arrive as host values (`kgrad.ProbeRecord`); histograms are the
``[k, 3]`` buckets computed on device, written with the histogram plugin's
metadata, so no full tensor ever crosses to the host. The tags and their
descriptions are `kgrad.plan.tag_names`' (the users' table is docs/tags.md); the
file itself is `kgrad.logs.event_file`'s.
"""

import os

import numpy as np
from tensorboard.compat.proto import summary_pb2, tensor_pb2, types_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata

from kgrad.logs import weight_shapes
from kgrad.logs.event_file import EventFile
from kgrad.logs.layout import custom_scalar_layout
from kgrad.logs.summary_bytes import SCALAR_SHAPE, SummaryLayout, histogram_proto, scalar_proto
from kgrad.logs.weight_shapes import WEIGHT_SHAPES_TAG
from kgrad.plan.tag_names import GLOBAL_PREFIX, GUARD_REPORT_TAG, describe_tag

#: Name of the run folder kgrad writes, beside Keras' ``train/`` and ``validation/``.
RUN_NAME = "kgrad"

#: The `kgrad.NonFiniteReport` fields of the replay, written with the report as they are.
_REPLAY_FIELDS = (
    "born_in", "born_at", "born_type", "born_path", "born_tape", "born_nan_count", "born_inf_count",
    "born_input_range", "born_inside", "born_step", "batch_index", "replayed", "replay_note", "reproduce",
)


def write_guard_report(log_dir, report):
    """Writes a tripped guard's `kgrad.NonFiniteReport` to ``<log_dir>/kgrad``.

    One text summary at the bad step, tag `kgrad.plan.tag_names.GUARD_REPORT_TAG`, holding JSON:
    `guard_report_fields`. The kgrad tab shows it on its NaN/Inf timeline;
    TensorBoard's Text tab shows it too.
    """
    import json

    events = EventFile(os.path.join(os.fspath(log_dir), RUN_NAME))
    text = json.dumps(guard_report_fields(report))
    events.write_summary(_text_summary(GUARD_REPORT_TAG, text), report.step)
    events.close()


def guard_report_fields(report):
    """A tripped guard's `kgrad.NonFiniteReport` as JSON-ready values (what TensorBoard and the sinks get).

    The report's fields (``pass_`` as ``"pass"``, ``non_finite`` as
    ``[[tensor, nan, inf], ...]``, the replay's ``born_*`` fields, no
    ``last_summaries``) and ``"message"``, the text the guard prints.
    """
    return {
        "message": str(report),
        "step": report.step,
        "tensor": report.tensor,
        "layer": report.layer,
        "kind": report.kind,
        "pass": report.pass_,
        "nan_count": report.nan_count,
        "inf_count": report.inf_count,
        "last_finite_step": report.last_finite_step,
        "last_finite_norm": report.last_finite_norm,
        "last_finite_norm_below": report.last_finite_norm_below,
        "non_finite": [[name, nan, inf] for name, (nan, inf) in report.non_finite.items()],
        # Where the replay found it born, for tools that read the logs.
        **{name: getattr(report, name) for name in _REPLAY_FIELDS},
    }


def layout_summary(layout):
    """The serialized Summary of a Custom Scalars ``layout``, as TensorBoard's ``custom_scalar.summary.pb``
    writes it, without the TensorFlow that ``pb`` imports."""
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING, tensor_shape=SCALAR_SHAPE, string_val=[layout.SerializeToString()]
    )
    summary = summary_pb2.Summary()
    summary.value.add(
        tag=custom_scalar_metadata.CONFIG_SUMMARY_TAG,
        metadata=custom_scalar_metadata.create_summary_metadata(),
        tensor=tensor,
    )
    return summary.SerializeToString()


def _text_summary(tag, text, plugin_name="text"):
    """A serialized Summary of one string, for TensorBoard's Text tab (``plugin_name="text"``)."""
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING, tensor_shape=SCALAR_SHAPE, string_val=[text.encode("utf-8")]
    )
    summary = summary_pb2.Summary()
    value = summary.value.add(tag=tag)
    if plugin_name == "text":
        from tensorboard.plugins.text import metadata as text_metadata

        value.metadata.CopyFrom(text_metadata.create_summary_metadata(display_name=tag, description=""))
    else:
        value.metadata.display_name = tag
        value.metadata.plugin_data.plugin_name = plugin_name
    value.tensor.CopyFrom(tensor)
    return summary.SerializeToString()


class EventFileOnWrite:
    """An event file (`kgrad.logs.event_file.EventFile`) in ``run_dir``, created on the first write.

    A run that never logs gets no file. `close` ends the file; a later write
    starts a new one, with `described` emptied and `_new_file` called.

    Attributes:
        run_dir: The run folder.
        described: The tags whose plugin and description the file holds
            (`described_entry`).
    """

    def __init__(self, run_dir):
        self.run_dir = run_dir
        self._events = None
        self.described = set()

    def events(self):
        """The open event file, created now if there is none."""
        if self._events is None:
            self._events = EventFile(self.run_dir)
            self.described = set()
            self._new_file()
        return self._events

    def _new_file(self):
        """Called when a file is created: what a subclass keeps per file starts anew."""

    def flush(self):
        """Writes buffered events to disk (called at the end of each epoch)."""
        if self._events is not None:
            self._events.flush()

    def close(self):
        """Flushes and closes the event file; a later write opens a new one."""
        if self._events is not None:
            self._events.close()
            self._events = None


class ProbeWriter(EventFileOnWrite):
    """Writes `kgrad.ProbeRecord`s to ``<log_dir>/kgrad``, created lazily.

    Each record is one Summary in one event (`kgrad.logs.event_file.EventFile`).
    The first record of a set of tags is built as a proto, with each tag's
    metadata; later ones fill the values into its bytes (`SummaryLayout`).

    Args:
        log_dir: The TensorBoard log directory (the one given to Keras'
            ``TensorBoard`` callback, if any).
        weight_shapes: ``fn() -> {weight path: shape}`` of the probed
            weights, or ``None``: written once per event file, with the
            first record (see `kgrad.logs.weight_shapes`).
    """

    def __init__(self, log_dir, weight_shapes=None):
        self.log_dir = os.fspath(log_dir)
        super().__init__(os.path.join(self.log_dir, RUN_NAME))
        self._weight_shapes = weight_shapes
        self._layouts = {}  # (scalar tags, histogram tags, shapes) -> SummaryLayout
        self._wrote_layout = False  # the custom-scalars layout, once per event file

    def _new_file(self):
        # Per file: a layout is made once its tags are described in it.
        self._layouts = {}
        self._wrote_layout = False

    def write(self, record):
        """Writes one record's scalars and histograms at ``record.step``."""
        events = self.events()
        if not self._wrote_layout and any(not tag.startswith(GLOBAL_PREFIX) for tag in record.scalars):
            # From the first record with layers: a step the loss scaler
            # skipped holds only global/ tags. TensorBoard reads one layout.
            layout = custom_scalar_layout(record.scalars)
            events.write_summary(layout_summary(layout), step=0)
            self._wrote_layout = True
            self._write_weight_shapes(events, record.step)
        events.write_summary(self._serialized_summary(record), record.step)

    def _write_weight_shapes(self, events, step):
        shapes = self._weight_shapes() if self._weight_shapes is not None else None
        if shapes:
            text = weight_shapes.encode(shapes)
            events.write_summary(_text_summary(WEIGHT_SHAPES_TAG, text, weight_shapes.PLUGIN_NAME), step)

    def _serialized_summary(self, record):
        histograms = [np.asarray(buckets) for buckets in record.histograms.values()]
        key = (tuple(record.scalars), tuple(record.histograms), tuple(h.shape for h in histograms))
        layout = self._layouts.get(key)
        if layout is None and (
            not self.described.issuperset(key[0]) or not self.described.issuperset(key[1])
        ):
            # TensorBoard reads a tag's plugin and description from its first
            # event in a file, as tf.summary writes them; later events omit them.
            summary = summary_pb2.Summary()
            for tag, value in record.scalars.items():
                self._add(summary, tag, scalar_metadata).tensor.CopyFrom(scalar_proto(value))
            for tag, buckets in record.histograms.items():
                self._add(summary, tag, histogram_metadata).tensor.CopyFrom(histogram_proto(buckets))
            return summary.SerializeToString()
        if layout is None:
            layout = self._layouts[key] = SummaryLayout(key[0], zip(key[1], key[2]))
        scalars = np.fromiter(record.scalars.values(), np.float32, count=len(record.scalars))
        return layout.fill(scalars, histograms)

    def _add(self, summary, tag, plugin_metadata):
        return described_entry(summary, tag, plugin_metadata, self.described)

def described_entry(summary, tag, plugin_metadata, described):
    """A new value of ``summary`` for ``tag``, with its plugin and description the first time.

    ``described`` is the set of tags that already have them in this event file (updated):
    TensorBoard reads a tag's plugin and description from its first event in a file.
    """
    entry = summary.value.add(tag=tag)
    if tag not in described:
        described.add(tag)
        entry.metadata.CopyFrom(
            plugin_metadata.create_summary_metadata(display_name=tag, description=describe_tag(tag))
        )
    return entry
