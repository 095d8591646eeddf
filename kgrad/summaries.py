"""Named summaries of a probed step: the tag scheme, computed on device.

Tags (stable; they are the users' TensorBoard layout):

=====================================  ==========================================
``activation_<stat>/<layer>``          the layer's output
``grad_<stat>/<layer>``                dJ/d(layer output)
``pred_grad_<stat>/<output>``          dJ/dŷ (shadow loss, see `prediction_gradient`)
``pred_grad_example_norm_mean/<out>``  mean over the batch of per-example ‖dJ/dŷ‖
``pred_grad_example_norm_max/<out>``   max over the batch of per-example ‖dJ/dŷ‖
``input_grad_<stat>/<input>``          dJ/dx
``weight_grad_<stat>/<weight path>``   dJ/dw
``weight_norm/<weight path>``          ‖w‖ before the update
``update_ratio/<weight path>``         ‖Δw‖/‖w‖ of the step (‖w‖ after, if 0 before)
``global/grad_norm``                   ‖dJ/dw‖ over all trainable weights
``global/loss_scale``                  the loss scale (LossScaleOptimizer only)
``global/loss_scale_skipped``          1 if the loss scaler skipped the update
``<kind>_hist/<name>``                 histogram of the same tensor
=====================================  ==========================================

``<weight path>`` is the variable's path inside the model, without the model's
own name (``dense_1/kernel``, ``block/conv/kernel``), so that runs of models
named ``sequential`` and ``sequential_1`` share charts.

``<stat>`` is one of `kgrad.stats.MOMENT_NAMES`: ``norm``, ``mean``, ``std``,
``min``, ``max``, ``zero_fraction``, ``nonfinite``.
"""

import tensorflow as tf

from kgrad import stats


class SummaryBuilder:
    """Accumulates named on-device summaries in a fixed order.

    Args:
        histograms: Whether tensors also get a histogram.
        bucket_count: Buckets per histogram.
    """

    def __init__(self, histograms, bucket_count):
        self._histograms = histograms
        self._bucket_count = bucket_count
        self.scalar_names = []
        # Float32 vectors whose concatenation is `scalars()`, in name order:
        # a tensor's moments stay one block (slicing them into scalars and
        # stacking them again took ~50 graph ops per tensor).
        self._scalar_blocks = []
        self.histogram_names = []
        self._histogram_values = []

    def add_tensor(self, kind, name, tensor):
        """Moments of ``tensor`` under ``<kind>_<stat>/<name>``, and its histogram.

        Returns the ``[7]`` moments tensor (`kgrad.stats.MOMENT_NAMES`).
        """
        bucket_count = self._bucket_count if self._histograms else None
        moments, histogram = stats.summarize(tensor, bucket_count)
        self.scalar_names += [f"{kind}_{stat}/{name}" for stat in stats.MOMENT_NAMES]
        self._scalar_blocks.append(moments)
        if histogram is not None:
            self.histogram_names.append(f"{kind}_hist/{name}")
            self._histogram_values.append(histogram)
        return moments

    def add_scalar(self, tag, value):
        self.scalar_names.append(tag)
        self._scalar_blocks.append(tf.reshape(tf.cast(value, tf.float32), [1]))

    def scalars(self):
        """All scalars as one ``[n]`` float32 vector, in ``scalar_names`` order."""
        if not self._scalar_blocks:
            return tf.zeros([0])
        return tf.concat(self._scalar_blocks, axis=0)

    def histograms(self):
        """All histograms as one ``[n, buckets, 3]`` float32 tensor."""
        if not self._histogram_values:
            return tf.zeros([0, self._bucket_count, 3])
        return tf.stack(self._histogram_values)


def io_names(structure, prefix, keras_names=None):
    """Report names for the leaves of a model's inputs or outputs.

    ``"input"`` / ``"output"`` for a single tensor; otherwise dict keys, the
    model's own names, or ``"<prefix>_<i>"``.
    """
    leaves = tf.nest.flatten(structure)
    if len(leaves) == 1:
        return [prefix]
    if isinstance(structure, dict):
        return [str(key) for key in sorted(structure)]
    if keras_names and len(keras_names) == len(leaves):
        return [str(name) for name in keras_names]
    return [f"{prefix}_{index}" for index in range(len(leaves))]
