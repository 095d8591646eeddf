"""kgrad's TensorFlow-free event files: TensorFlow's own framing, read back alike by every reader.

kgrad frames records itself (`kgrad.logs.event_file.RecordFile`); the bytes
must be those ``tf.io.TFRecordWriter`` writes, and a probed run must read the
same through TensorBoard's reader, tbparse and `kgrad.read_logs`.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboard_crc

import kgrad
from kgrad.logs import event_file
from kgrad.logs.record import ProbeRecord
from kgrad.logs.writer import ProbeWriter


@pytest.mark.parametrize("size", [0, 1, 255, 4096, 200_000])
def test_the_masked_crc32c_is_tensorboards(size):
    data = np.random.default_rng(size).bytes(size)
    assert event_file.masked_crc32c(data) == tensorboard_crc(data)


def test_records_are_the_bytes_tensorflows_record_writer_writes(tmp_path):
    records = [b"", b"x", np.random.default_rng(0).bytes(70_000), b"kgrad" * 100]
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    with open(ours, "wb") as file:
        writer = event_file.RecordFile(file)
        for record in records:
            writer.write(record)
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for record in records:
            writer.write(record)
    assert ours.read_bytes() == theirs.read_bytes()
    assert [record.numpy() for record in tf.data.TFRecordDataset(str(ours))] == records


def _probe_run(log_dir):
    writer = ProbeWriter(log_dir)
    rng = np.random.default_rng(0)
    for step in (0, 5, 10):
        buckets = np.stack([np.arange(4.0), np.arange(1.0, 5.0), rng.integers(0, 9, 4)], axis=1)
        writer.write(ProbeRecord(
            step,
            {"grad_norm/dense": float(rng.random()), "weight_grad_norm/m/dense/kernel": float(step)},
            {"grad_hist/dense": buckets},
        ))
    writer.close()
    return os.path.join(log_dir, "kgrad")


def test_a_probed_run_reads_the_same_through_tensorboard_tbparse_and_read_logs(tmp_path):
    tbparse = pytest.importorskip("tbparse")
    run_dir = _probe_run(str(tmp_path / "run"))
    logs = kgrad.read_logs(str(tmp_path / "run"))
    ours = {tag: (series.steps.tolist(), series.values.tolist())
            for tag, series in logs["kgrad"]["scalars"].items()}

    accumulator = event_accumulator.EventAccumulator(run_dir, size_guidance={"tensors": 0})
    accumulator.Reload()
    tensorboards = {
        tag: ([event.step for event in accumulator.Tensors(tag)],
              [float(tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors(tag)])
        for tag in accumulator.Tags()["tensors"] if tag in ours
    }
    # kgrad writes scalars and histograms as tensors with their plugins' metadata.
    frame = tbparse.SummaryReader(run_dir).tensors
    tbparses = {
        tag: (group["step"].tolist(), [float(value) for value in group["value"]])
        for tag, group in frame.groupby("tag") if tag in ours
    }
    assert set(ours) == {"grad_norm/dense", "weight_grad_norm/m/dense/kernel"}
    assert ours == tensorboards == tbparses
    histogram = [tf.make_ndarray(event.tensor_proto) for event in accumulator.Tensors("grad_hist/dense")]
    by_tbparse = np.stack(frame[frame["tag"] == "grad_hist/dense"]["value"].tolist())
    np.testing.assert_array_equal(np.stack(histogram), logs["kgrad"]["histograms"]["grad_hist/dense"].values)
    np.testing.assert_array_equal(by_tbparse, np.stack(histogram))


def test_a_url_needs_tensorflow_and_says_so(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorflow(name, *args, **kwargs):
        if name.split(".")[0] == "tensorflow":
            raise ImportError("No module named 'tensorflow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorflow)
    with pytest.raises(ValueError, match=r"through TensorFlow's file systems.*pip install tensorflow"):
        event_file.EventFile("gs://bucket/run")


def test_a_url_is_written_through_tensorflows_file_systems(tmp_path):
    # TensorFlow's in-memory file system stands in for gs:// (no network here).
    events = event_file.EventFile("ram://kgrad-test/run")
    events.write_summary(b"", step=1)
    events.close()
    assert tf.io.gfile.exists(events.path) and tf.io.gfile.stat(events.path).length > 0


def test_the_custom_scalars_layout_is_the_summary_tensorboards_pb_writes():
    from tensorboard.plugins.custom_scalar import summary as custom_scalar_summary

    from kgrad.logs import writer
    from kgrad.logs.layout import custom_scalar_layout

    layout = custom_scalar_layout({"grad_norm/a": 1.0, "grad_norm/b": 2.0, "weight_grad_norm/a/kernel": 1.0})
    assert writer.layout_summary(layout) == custom_scalar_summary.pb(layout).SerializeToString()
