"""The only module that writes TensorBoard event files.

Records arrive as host values (`kgrad.ProbeRecord`); histograms are the
``[k, 3]`` buckets computed on device, written with the histogram plugin's
metadata, so no full tensor ever crosses to the host. The tag scheme is
documented in `kgrad.summaries`.
"""

import os

import numpy as np
import tensorflow as tf
from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import summary as custom_scalar_summary
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata

#: Name of the run folder kgrad writes, beside Keras' ``train/`` and ``validation/``.
RUN_NAME = "kgrad"

#: Charts of the custom-scalars dashboard: (category, chart title, tag regex).
#: TensorBoard matches each regex at the start of the tag.
LAYOUT_CHARTS = (
    ("kgrad: gradients", "dJ/d(activation) norm, every layer", r"grad_norm/"),
    ("kgrad: gradients", "dJ/dw norm, every weight", r"weight_grad_norm/"),
    ("kgrad: gradients", "dJ/dŷ and dJ/dx norm", r"(pred_grad|input_grad)_norm/"),
    ("kgrad: gradients", "global gradient norm", r"global/grad_norm$"),
    ("kgrad: updates", "update / weight ratio, every weight", r"update_ratio/"),
    ("kgrad: activations", "activation norm, every layer", r"activation_norm/"),
    ("kgrad: activations", "fraction of zero activations", r"activation_zero_fraction/"),
    ("kgrad: health", "non-finite values", r"[a-z_]*_nonfinite/"),
)

# What each tag prefix measures; shown by TensorBoard as the chart's description.
_KIND_DESCRIPTIONS = {
    "activation": "the output of layer `{name}`",
    "grad": "dJ/d(output of layer `{name}`)",
    "pred_grad": "dJ/dŷ for output `{name}`",
    "input_grad": "dJ/dx for input `{name}`",
    "weight_grad": "dJ/dw for weight `{name}`",
}
_STAT_WORDS = {
    "norm": "L2 norm of",
    "mean": "mean of",
    "std": "standard deviation of",
    "min": "min of",
    "max": "max of",
    "zero_fraction": "fraction of zeros in",
    "nonfinite": "count of NaN/Inf in",
    "hist": "histogram of",
}
_OTHER_DESCRIPTIONS = {
    "weight_norm": "‖w‖ of weight `{name}` before the update",
    "update_ratio": "‖Δw‖ / ‖w‖ of weight `{name}` in the probed step",
    "pred_grad_example_norm_mean": "mean over the batch of per-example ‖dJ/dŷ‖, output `{name}`",
    "pred_grad_example_norm_max": "max over the batch of per-example ‖dJ/dŷ‖, output `{name}`",
}
# Tags under ``global/`` described one by one.
_GLOBAL_DESCRIPTIONS = {
    "global/grad_norm": "‖dJ/dw‖ over all trainable weights",
    "global/loss_scale": "loss scale of the LossScaleOptimizer in the probed step",
    "global/loss_scale_skipped": "1 if the loss scaler skipped the update "
    "(its scaled gradients overflowed), else 0",
}


def describe_tag(tag):
    """A one-line description of a kgrad tag, for TensorBoard's tooltips.

    Example:

    >>> from kgrad.tensorboard import describe_tag
    >>> describe_tag("grad_norm/dense_1")
    'kgrad: L2 norm of dJ/d(output of layer `dense_1`)'
    """
    if tag in _GLOBAL_DESCRIPTIONS:
        return "kgrad: " + _GLOBAL_DESCRIPTIONS[tag]
    prefix, _, name = tag.partition("/")
    if prefix in _OTHER_DESCRIPTIONS:
        return "kgrad: " + _OTHER_DESCRIPTIONS[prefix].format(name=name)
    for kind, what in _KIND_DESCRIPTIONS.items():
        stat = prefix[len(kind) + 1 :]
        if prefix.startswith(kind + "_") and stat in _STAT_WORDS:
            return f"kgrad: {_STAT_WORDS[stat]} {what.format(name=name)}"
    return "kgrad"


def custom_scalar_layout():
    """The custom-scalars dashboard layout: one chart per quantity, all layers."""
    categories = {}
    for category, title, regex in LAYOUT_CHARTS:
        chart = layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=[regex]))
        categories.setdefault(category, []).append(chart)
    return layout_pb2.Layout(
        category=[layout_pb2.Category(title=title, chart=charts) for title, charts in categories.items()]
    )


class ProbeWriter:
    """Writes `kgrad.ProbeRecord`s to ``<log_dir>/kgrad``, created lazily.

    Each record is one Summary written by one op of TensorFlow's own event
    writer, which checksums in C++ (TensorBoard's ``EventFileWriter`` does it
    in Python, several CPU-ms per record of a few hundred tags).

    Args:
        log_dir: The TensorBoard log directory (the one given to Keras'
            ``TensorBoard`` callback, if any).
    """

    def __init__(self, log_dir):
        self.log_dir = os.fspath(log_dir)
        self.run_dir = os.path.join(self.log_dir, RUN_NAME)
        self._writer = None
        self._described = set()  # tags whose metadata this event file holds
        self._templates = {}  # tag lists -> reusable Summary without metadata

    def _file_writer(self):
        if self._writer is None:
            # Created on first write: no event file for runs that never log.
            self._writer = tf.summary.create_file_writer(self.run_dir)
            self._described = set()
            self._templates = {}
            with self._writer.as_default(), tf.summary.record_if(True):
                tf.summary.experimental.write_raw_pb(
                    custom_scalar_summary.pb(custom_scalar_layout()).SerializeToString(),
                    step=0,
                )
        return self._writer

    def write(self, record):
        """Writes one record's scalars and histograms at ``record.step``."""
        writer = self._file_writer()
        summary = self._summary(record)
        # record_if(True): Keras' TensorBoard(update_freq=N) sets a global
        # record_if around each batch that would drop probed steps.
        # The step as np.int64: TensorFlow caches the tensor of every Python
        # int it converts, so a new int per step grows memory without bound.
        with writer.as_default(), tf.summary.record_if(True):
            tf.summary.experimental.write_raw_pb(
                summary.SerializeToString(), step=np.int64(record.step)
            )

    def _summary(self, record):
        # One Summary per record. Records of a run have the same tags, so the
        # Summary built for the first is kept as a template whose values are
        # replaced: hundreds of values per record, microseconds each.
        key = (tuple(record.scalars), tuple(record.histograms))
        template = self._templates.get(key)
        if template is None:
            summary = summary_pb2.Summary()
            for tag, value in record.scalars.items():
                self._add(summary, tag, scalar_metadata).tensor.CopyFrom(_scalar_proto(value))
            for tag, buckets in record.histograms.items():
                self._add(summary, tag, histogram_metadata).tensor.CopyFrom(_histogram_proto(buckets))
            template = summary_pb2.Summary()
            template.CopyFrom(summary)
            for entry in template.value:
                entry.ClearField("metadata")
            self._templates[key] = template
            return summary
        # A copy per record: the protobuf runtime frees replaced bytes only
        # with the message, so refilling one long-lived Summary grows forever.
        summary = summary_pb2.Summary()
        summary.CopyFrom(template)
        entries = summary.value
        for index, value in enumerate(record.scalars.values()):
            entries[index].tensor.float_val[0] = value
        offset = len(record.scalars)
        for index, buckets in enumerate(record.histograms.values()):
            entries[offset + index].tensor.tensor_content = _histogram_bytes(buckets)
        return summary

    def _add(self, summary, tag, plugin_metadata):
        entry = summary.value.add(tag=tag)
        # TensorBoard reads a tag's plugin and description from its first
        # event in a file, as tf.summary does; later events omit them.
        if tag not in self._described:
            self._described.add(tag)
            entry.metadata.CopyFrom(
                plugin_metadata.create_summary_metadata(display_name=tag, description=describe_tag(tag))
            )
        return entry

    def flush(self):
        """Writes buffered events to disk (called at the end of each epoch)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self):
        """Flushes and closes the event file; a later `write` opens a new one."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# Tensor protos built directly: `tensor_util.make_tensor_proto` is general and
# costs tens of microseconds per value, hundreds of values per record.
_SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()


def _scalar_proto(value):
    """A float32 scalar TensorProto, as ``tf.summary.scalar`` writes it."""
    return tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, tensor_shape=_SCALAR_SHAPE, float_val=[value]
    )


def _histogram_proto(buckets):
    """A float64 ``[k, 3]`` TensorProto, as ``tf.summary.histogram`` writes it."""
    shape = tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=size) for size in np.shape(buckets)]
    )
    return tensor_pb2.TensorProto(
        dtype=types_pb2.DT_DOUBLE, tensor_shape=shape, tensor_content=_histogram_bytes(buckets)
    )


def _histogram_bytes(buckets):
    return np.ascontiguousarray(buckets, dtype=np.float64).tobytes()
