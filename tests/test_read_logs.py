"""`kgrad.read_logs` on event files written by hand with ``tf.summary``."""

import numpy as np
import pytest
import tensorflow as tf

import kgrad


def write(run_dir, scalars=(), histograms=()):
    """Writes ``(tag, step, value)`` scalars and ``(tag, step, data, buckets)`` histograms."""
    writer = tf.summary.create_file_writer(str(run_dir))
    with writer.as_default():
        for tag, step, value in scalars:
            tf.summary.scalar(tag, value, step=step)
        for tag, step, data, buckets in histograms:
            tf.summary.histogram(tag, data, step=step, buckets=buckets)
    writer.close()


def test_every_run_with_its_scalars_and_histograms(tmp_path):
    write(tmp_path / "a" / "train", scalars=[("loss", 0, 2.0), ("loss", 1, 1.5), ("acc", 1, 0.25)])
    write(tmp_path / "b", histograms=[("weights", 5, [1.0, 2.0, 2.0, 3.0], 3)])
    write(tmp_path, scalars=[("top", 7, -1.0)])
    (tmp_path / "empty").mkdir()

    logs = kgrad.read_logs(tmp_path)

    assert list(logs) == [".", "a/train", "b"]
    # weight_shapes: {} for a run no GradientProbe wrote
    assert logs["."] == {"scalars": logs["."]["scalars"], "histograms": {}, "weight_shapes": {}}
    steps, values = logs["a/train"]["scalars"]["loss"]
    assert steps.dtype == np.int64 and values.dtype == np.float64
    assert steps.tolist() == [0, 1] and values.tolist() == [2.0, 1.5]
    assert logs["a/train"]["scalars"]["acc"].steps.tolist() == [1]
    histogram = logs["b"]["histograms"]["weights"]
    assert histogram.steps.tolist() == [5]
    assert histogram.values.shape == (1, 3, 3)
    assert histogram.values[0, :, 2].sum() == 4
    assert histogram.values[0, 0, 0] == 1.0 and histogram.values[0, -1, 1] == 3.0


def test_tags_keep_the_order_they_were_first_written(tmp_path):
    names = ["hidden_1", "hidden_2", "hidden_10", "a_last"]
    write(tmp_path, scalars=[(f"grad_norm/{name}", 0, 1.0) for name in names])
    assert list(kgrad.read_logs(tmp_path)["."]["scalars"]) == [f"grad_norm/{name}" for name in names]


def test_nothing_is_down_sampled(tmp_path):
    write(tmp_path, scalars=[("loss", step, float(step)) for step in range(1200)])
    steps, values = kgrad.read_logs(tmp_path)["."]["scalars"]["loss"]
    assert steps.tolist() == list(range(1200)) and values[-1] == 1199.0


def test_histograms_whose_bucket_count_changes_come_back_as_a_list(tmp_path):
    write(tmp_path, histograms=[("h", 0, [1.0, 2.0], 2), ("h", 1, [1.0, 2.0], 4)])
    values = kgrad.read_logs(tmp_path)["."]["histograms"]["h"].values
    assert [array.shape for array in values] == [(2, 3), (4, 3)]


def test_a_directory_without_events_reads_as_no_runs(tmp_path):
    assert kgrad.read_logs(tmp_path) == {}


@pytest.mark.parametrize(
    "log_dir, error, match",
    [
        ("{tmp}/missing", FileNotFoundError, r"`log_dir` does not exist: log_dir='.*missing'"),
        ("{tmp}/file.txt", NotADirectoryError, r"must be a directory, not a file: log_dir='.*file.txt'"),
        (42, TypeError, r"must be a path \(str or os.PathLike\). Received: log_dir=42"),
    ],
)
def test_errors_name_the_argument_and_value(tmp_path, log_dir, error, match):
    (tmp_path / "file.txt").write_text("not a log")
    if isinstance(log_dir, str):
        log_dir = log_dir.format(tmp=tmp_path)
    with pytest.raises(error, match=match):
        kgrad.read_logs(log_dir)
