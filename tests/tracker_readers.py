"""Reading back what the trackers recorded, without their servers: W&B offline runs, MLflow local stores.

A W&B offline run is one ``run-<id>.wandb`` file: W&B's LevelDB-style log
(a 7-byte header ``:W&B``, 0xBEE1, version; then 32 KiB blocks of records,
each ``crc32 (4) | length (2) | type (1) | data``, a record split over blocks
as FIRST, MIDDLE..., LAST), each record a ``wandb_internal_pb2.Record``.
The reader checks every CRC, so that a misread fails loudly.
"""

import glob
import json
import os
import struct
import time
import zlib

_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_records(path):
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as file:
        raw = file.read()
    if len(raw) < _HEADER:
        return  # still being written
    assert raw[:4] == b":W&B" and struct.unpack("<H", raw[4:6])[0] == 0xBEE1, raw[:7]
    position, pending = _HEADER, b""
    while position + _HEADER <= len(raw):
        left_in_block = _BLOCK - position % _BLOCK
        if left_in_block < _HEADER:  # a block's tail too short for a header is padding
            position += left_in_block
            continue
        crc, length, kind = struct.unpack("<IHB", raw[position : position + _HEADER])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            position += left_in_block
            continue
        if position + _HEADER + length > len(raw):
            break  # still being written
        data = raw[position + _HEADER : position + _HEADER + length]
        assert zlib.crc32(data, zlib.crc32(bytes([kind]))) == crc, f"bad CRC at byte {position} of {path}"
        position += _HEADER + length
        pending += data
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _items(items):
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def wandb_run(run_dir):
    """``(history rows, summary, files dir)`` of an offline W&B run folder (``run.dir``'s parent).

    History rows are dicts of flattened keys (``kgrad/grad_hist/out/values``)
    to decoded JSON values; the summary is the last value of each key its
    updates set.
    """
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    # W&B's service may still be writing the file when `run.finish()` returns: the run is
    # complete once its "exit" record is there.
    deadline = time.monotonic() + 120
    records = list(_wandb_records(path))
    while not (records and records[-1].WhichOneof("record_type") == "exit") and time.monotonic() < deadline:
        time.sleep(0.2)
        records = list(_wandb_records(path))
    history, summary = [], {}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(_items(record.history.item))
        elif kind == "summary":
            summary.update(_items(record.summary.update))
    return history, summary, os.path.join(run_dir, "files")


def wandb_series(history, key, step_key="kgrad/step"):
    """``{step: value}`` of ``key`` over the history rows that hold it."""
    return {row[step_key]: row[key] for row in history if key in row}


def mlflow_series(client, run_id, key):
    """``{step: value}`` of an MLflow metric (``MlflowClient.get_metric_history``)."""
    return {metric.step: metric.value for metric in client.get_metric_history(run_id, key)}
