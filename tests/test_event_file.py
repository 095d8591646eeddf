"""kgrad's event files: the bytes protobuf would write, read back by TensorBoard."""

import os

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2, summary_pb2

from kgrad.logs import event_file, summary_bytes


def scalar_summary(tag, value):
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])


def events_on_disk(path):
    return list(event_file_loader.LegacyEventFileLoader(path).Load())


@pytest.mark.parametrize("tags", [1, 5, 400, 3000])  # Summary lengths across 1-, 2- and 3-byte varints
@pytest.mark.parametrize("step", [0, 1, 2**40])
def test_event_bytes_are_protobufs_own_serialization(tags, step):
    summary = summary_pb2.Summary()
    for index in range(tags):
        summary.value.add(tag=f"t{index}", simple_value=float(index))
    serialized = summary.SerializeToString()
    expected = event_pb2.Event(wall_time=12.5, step=step, summary=summary).SerializeToString()
    assert event_file.event_bytes(serialized, step, 12.5) == expected


def test_file_starts_with_its_version_and_holds_the_events_in_order(tmp_path):
    events = event_file.EventFile(tmp_path / "run")
    for step in (3, 1, 7):
        events.write_summary(scalar_summary("x", step / 2).SerializeToString(), step)
    events.close()
    (name,) = os.listdir(tmp_path / "run")
    assert name.startswith("events.out.tfevents.") and name.endswith(".v2")
    read = events_on_disk(events.path)
    assert read[0].file_version == event_file.FILE_VERSION
    assert [(event.step, event.summary.value[0].simple_value) for event in read[1:]] == [
        (3, 1.5), (1, 0.5), (7, 3.5)
    ]


def test_files_opened_in_the_same_second_get_their_own_names(tmp_path):
    paths = {event_file.EventFile(tmp_path).path for _ in range(3)}
    assert len(paths) == 3 and len(os.listdir(tmp_path)) == 3


def test_events_reach_the_disk_every_max_queue_events_without_a_flush(tmp_path):
    events = event_file.EventFile(tmp_path, max_queue=3)
    seen = []
    for step in range(5):
        events.write_summary(scalar_summary("x", 1.0).SerializeToString(), step)
        seen.append([event.step for event in events_on_disk(events.path)[1:]])
    assert seen == [[], [], [0, 1, 2], [0, 1, 2], [0, 1, 2]]
    events.close()
    assert [event.step for event in events_on_disk(events.path)[1:]] == [0, 1, 2, 3, 4]


def test_events_reach_the_disk_after_flush_secs(tmp_path):
    events = event_file.EventFile(tmp_path, max_queue=1000, flush_secs=0)
    events.write_summary(scalar_summary("x", 1.0).SerializeToString(), 4)
    assert [event.step for event in events_on_disk(events.path)[1:]] == [4]
    events.close()


def proto_summary(scalars, histograms):
    """The reference: the Summary built field by field, as for a record's first event."""
    summary = summary_pb2.Summary()
    for tag, value in scalars.items():
        summary.value.add(tag=tag).tensor.CopyFrom(summary_bytes.scalar_proto(value))
    for tag, buckets in histograms.items():
        summary.value.add(tag=tag).tensor.CopyFrom(summary_bytes.histogram_proto(buckets))
    return summary


def test_summary_layout_fills_the_bytes_protobuf_would_write():
    rng = np.random.default_rng(0)
    scalar_tags = ["grad_norm/a", "weight_norm/ü/kernel", "x" * 300, "global/grad_norm"]
    shapes = {"grad_hist/a": (30, 3), "weight_grad_hist/b" * 20: (1, 3), "h": (7, 3)}
    layout = summary_bytes.SummaryLayout(scalar_tags, shapes.items())
    for values in (rng.normal(size=4), [np.nan, np.inf, -0.0, 3e38]):
        scalars = dict(zip(scalar_tags, np.asarray(values, np.float32).tolist()))
        histograms = {tag: rng.normal(size=shape).astype(np.float32) for tag, shape in shapes.items()}
        filled = layout.fill(np.float32(list(scalars.values())), list(histograms.values()))
        assert filled == proto_summary(scalars, histograms).SerializeToString()
