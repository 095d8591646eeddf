"""Reading TensorBoard logs back as plain Python and NumPy values.

Built on TensorBoard's own event reader (the ``plugin_event_multiplexer``
that ``tensorboard --logdir`` uses), so what `read_logs` returns is what the
TensorBoard UI shows: every run under the log directory, scalars written by
``tf.summary.scalar`` (kgrad's and Keras' ``epoch_loss``...) and histograms
written by kgrad or by ``tf.summary.histogram``.
"""

import collections
import os

import numpy as np
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util import tensor_util

from kgrad.logs import weight_shapes
from kgrad.logs.weight_shapes import WEIGHT_SHAPES_TAG

#: One logged series: ``steps`` (int64 ``[n]``) and ``values``, in file order.
Series = collections.namedtuple("Series", ["steps", "values"])


def read_logs(log_dir):
    """Reads every run under ``log_dir`` into NumPy arrays.

    A run is a folder holding event files, named by its path relative to
    ``log_dir`` as TensorBoard names it: ``"kgrad"``, ``"train"``,
    ``"sigmoid_deep/kgrad"``, or ``"."`` for event files directly in
    ``log_dir``. Nothing is down-sampled: every logged step is returned.

    Args:
        log_dir: A TensorBoard log directory (what you would pass to
            ``tensorboard --logdir``), or one run's folder.

    Returns:
        ``{run: {"scalars": {tag: Series}, "histograms": {tag: Series},
        "weight_shapes": {weight path: shape}}}`` (``weight_shapes`` as a
        `GradientProbe` logs them; ``{}`` for other writers).
        A ``Series`` is a named tuple ``(steps, values)``: ``steps`` an int64
        array ``[n]``; for scalars ``values`` a float64 array ``[n]``; for
        histograms a float64 array ``[n, buckets, 3]`` of (left edge, right
        edge, count) per step (a list of ``[buckets_i, 3]`` arrays if the
        bucket count changes between steps). Runs are sorted by name; tags
        keep the order in which they were first written (for kgrad: the
        model's forward order). Runs with neither scalars nor histograms are
        left out.

    Raises:
        FileNotFoundError: If ``log_dir`` does not exist.
        NotADirectoryError: If ``log_dir`` is not a directory.

    Example:

    >>> import kgrad, tempfile, tensorflow as tf
    >>> log_dir = tempfile.mkdtemp()
    >>> with tf.summary.create_file_writer(log_dir + "/train").as_default():
    ...     for step in range(3):
    ...         _ = tf.summary.scalar("loss", 1.0 / (step + 1), step=step)
    >>> steps, values = kgrad.read_logs(log_dir)["train"]["scalars"]["loss"]
    >>> steps.tolist(), values.round(2).tolist()
    ([0, 1, 2], [1.0, 0.5, 0.33])
    """
    log_dir = _existing_directory(log_dir)
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        size_guidance=plugin_event_accumulator.STORE_EVERYTHING_SIZE_GUIDANCE
    )
    multiplexer.AddRunsFromDirectory(log_dir)
    multiplexer.Reload()
    logs = {}
    for run in sorted(multiplexer.Runs()):
        scalars = _read_plugin(multiplexer, run, scalar_metadata.PLUGIN_NAME, _scalar_values)
        histograms = _read_plugin(multiplexer, run, histogram_metadata.PLUGIN_NAME, _histogram_values)
        if scalars or histograms:
            shapes = _weight_shapes(multiplexer, run)
            logs[run] = {"scalars": scalars, "histograms": histograms, "weight_shapes": shapes}
    return logs


def _weight_shapes(multiplexer, run):
    if WEIGHT_SHAPES_TAG not in multiplexer.PluginRunToTagToContent(weight_shapes.PLUGIN_NAME).get(run, {}):
        return {}
    events = sorted(multiplexer.Tensors(run, WEIGHT_SHAPES_TAG), key=lambda event: event.wall_time)
    texts = [(event.step, tensor_util.make_ndarray(event.tensor_proto).item().decode()) for event in events]
    return weight_shapes.latest(texts)


def _existing_directory(log_dir):
    if not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(f"`log_dir` must be a path (str or os.PathLike). Received: log_dir={log_dir!r}.")
    log_dir = os.fspath(log_dir)
    if not os.path.exists(log_dir):
        raise FileNotFoundError(
            f"`log_dir` does not exist: log_dir={log_dir!r}. Pass the folder given "
            "to GradientProbe(log_dir=...) or to `tensorboard --logdir`."
        )
    if not os.path.isdir(log_dir):
        raise NotADirectoryError(
            f"`log_dir` must be a directory, not a file: log_dir={log_dir!r}. "
            "Pass the folder that holds the run folders (e.g. 'logs/')."
        )
    return log_dir


def _read_plugin(multiplexer, run, plugin_name, convert):
    tags = multiplexer.PluginRunToTagToContent(plugin_name).get(run, {})
    series = {}
    for tag in tags:  # in the order first written: forward order of layers
        # Event files of one run are read in file-name order, which is not
        # their writing order when a process opens ten or more in the same
        # second ("...9.v2" sorts after "...10.v2"); wall time is.
        events = sorted(multiplexer.Tensors(run, tag), key=lambda event: event.wall_time)
        steps = np.array([event.step for event in events], dtype=np.int64)
        values = [tensor_util.make_ndarray(event.tensor_proto) for event in events]
        series[tag] = Series(steps, convert(values))
    return series


def _scalar_values(values):
    return np.array([float(np.reshape(value, [])) for value in values], dtype=np.float64)


def _histogram_values(values):
    arrays = [np.asarray(value, dtype=np.float64).reshape(-1, 3) for value in values]
    if len({array.shape for array in arrays}) > 1:
        return arrays
    return np.stack(arrays) if arrays else np.zeros([0, 0, 3])
