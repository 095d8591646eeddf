"""The only module that writes TensorBoard event files.

Records arrive as host values (`kgrad.ProbeRecord`); histograms are the
``[k, 3]`` buckets computed on device, written with the histogram plugin's
metadata, so no full tensor ever crosses to the host.
"""

import os

import tensorflow as tf
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import summary as custom_scalar_summary
from tensorboard.plugins.histogram import metadata as histogram_metadata

#: Name of the run folder kgrad writes, beside Keras' ``train/`` and ``validation/``.
RUN_NAME = "kgrad"

#: Charts of the custom-scalars dashboard: (category, chart title, tag regex).
LAYOUT_CHARTS = (
    ("kgrad: gradients", "dJ/d(activation) norm, every layer", r"grad_norm/.*"),
    ("kgrad: gradients", "dJ/dw norm, every weight", r"weight_grad_norm/.*"),
    ("kgrad: gradients", "global gradient norm", r"global/grad_norm"),
    ("kgrad: updates", "update / weight ratio", r"update_ratio/.*"),
    ("kgrad: activations", "fraction of zero activations", r"activation_zero_fraction/.*"),
    ("kgrad: health", "non-finite gradient values", r"(grad|weight_grad|pred_grad)_nonfinite/.*"),
)


def custom_scalar_layout():
    """The custom-scalars dashboard layout: one chart per quantity, all layers."""
    categories = {}
    for category, title, regex in LAYOUT_CHARTS:
        chart = layout_pb2.Chart(
            title=title, multiline=layout_pb2.MultilineChartContent(tag=[regex])
        )
        categories.setdefault(category, []).append(chart)
    return layout_pb2.Layout(
        category=[
            layout_pb2.Category(title=title, chart=charts)
            for title, charts in categories.items()
        ]
    )


class ProbeWriter:
    """Writes `kgrad.ProbeRecord`s to ``<log_dir>/kgrad``, created lazily.

    Args:
        log_dir: The TensorBoard log directory (the one given to Keras'
            ``TensorBoard`` callback, if any).
    """

    def __init__(self, log_dir):
        self.log_dir = os.fspath(log_dir)
        self.run_dir = os.path.join(self.log_dir, RUN_NAME)
        self._writer = None

    def _file_writer(self):
        if self._writer is None:
            # Created on first write: no event file for runs that never log.
            self._writer = tf.summary.create_file_writer(self.run_dir)
            with self._writer.as_default():
                tf.summary.experimental.write_raw_pb(
                    custom_scalar_summary.pb(custom_scalar_layout()).SerializeToString(),
                    step=0,
                )
        return self._writer

    def write(self, record):
        """Writes one record's scalars and histograms at ``record.step``."""
        with self._file_writer().as_default():
            for tag, value in record.scalars.items():
                tf.summary.scalar(tag, value, step=record.step)
            for tag, buckets in record.histograms.items():
                tf.summary.write(
                    tag,
                    tensor=tf.constant(buckets, tf.float64),
                    step=record.step,
                    metadata=histogram_metadata.create_summary_metadata(
                        display_name=tag, description=""
                    ),
                )

    def flush(self):
        if self._writer is not None:
            self._writer.flush()

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
