"""Decoding many event records that share one byte layout, with NumPy.

kgrad's writer (`kgrad.logs.summary_bytes.SummaryLayout`) writes every probed step
of a run as the same bytes with other values: the same tags in the same
order, each float32 scalar and each histogram's buckets at the same offset.
Parsing 10 000 such records value by value costs ~1 µs a value (16 million
values for 200 layers); here the first record of a group is parsed with
protobuf to find where each value lies, the others are checked to differ
from it only there, and all values are read at once.

Anything that does not fit (metadata, strings, other writers' layouts) is
left to the caller's protobuf path: `decode_group` returns ``None``.
"""

import numpy as np
from tensorboard.compat.proto import event_pb2, types_pb2

_SUMMARY_VALUE_KEY = b"\x0a"  # Summary.value: field 1, length-delimited
_WALL_TIME_KEY, _STEP_KEY = 0x09, 0x10  # Event.wall_time (fixed64), Event.step (varint)
_SUMMARY_KEY = 0x2A  # Event.summary: field 5, length-delimited


def _varint(number):
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _fields(record, kind_of):
    """``(summary start, [(tag, kind, offset, size, dtype)])`` of a record, or ``None``."""
    event = event_pb2.Event.FromString(record)
    if not event.HasField("summary") or record[0] != _WALL_TIME_KEY or record[9] != _STEP_KEY:
        return None
    summary = event.summary.SerializeToString()
    start = len(record) - len(summary)
    header_end = 10 + len(_varint(event.step))
    expected_start = header_end + 1 + len(_varint(len(summary)))
    if start != expected_start or record[header_end] != _SUMMARY_KEY or record[start:] != summary:
        return None  # Event fields other than wall_time, step, summary
    fields, position = [], start
    for value in event.summary.value:
        if value.HasField("metadata") or value.tag not in kind_of:
            return None  # a tag's first event in the file: TensorBoard reads its metadata
        piece = value.SerializeToString()
        body = position + len(_SUMMARY_VALUE_KEY) + len(_varint(len(piece)))
        if (
            record[position:body] != _SUMMARY_VALUE_KEY + _varint(len(piece))
            or record[body : body + len(piece)] != piece
        ):
            return None
        tensor = value.tensor
        if len(tensor.float_val) == 1 and not tensor.tensor_content:
            # float_val is the tensor's last field, and the tensor the value's.
            if piece[-4:] != np.float32(tensor.float_val[0]).tobytes():
                return None
            fields.append((value.tag, kind_of[value.tag], body + len(piece) - 4, 4, "<f4"))
        elif tensor.tensor_content and tensor.dtype in (types_pb2.DT_DOUBLE, types_pb2.DT_FLOAT):
            content = tensor.tensor_content
            if piece.count(content) != 1:
                return None
            dtype = "<f8" if tensor.dtype == types_pb2.DT_DOUBLE else "<f4"
            fields.append((value.tag, kind_of[value.tag], body + piece.index(content), len(content), dtype))
        else:
            return None
        position = body + len(piece)
    return (header_end, fields) if position == len(record) else None


def decode_group(records, kind_of):
    """The values of records of one length that share the first one's layout.

    Args:
        records: Serialized ``Event`` records (bytes-like), all of one length.
        kind_of: Tag -> kind (``"scalars"``, ``"histograms"``, or a kind to
            skip), as learned from the file's earlier records.

    Returns:
        ``(wall_times, steps, {tag: (kind, values)})``: float64 ``[n]``, int64
        ``[n]``, and per tag float64 ``[n]`` (scalars) or float32 ``[n, k, 3]``
        (histograms); ``None`` when the records do not share a layout.
    """
    layout = _fields(bytes(records[0]), kind_of)
    if layout is None:
        return None
    header_end, fields = layout
    length = len(records[0])
    table = np.frombuffer(b"".join(records), np.uint8).reshape(len(records), length)
    varying = np.zeros(length, bool)
    varying[1:9] = True  # wall_time
    varying[10:header_end] = True  # step
    for _, _, offset, size, _ in fields:
        varying[offset : offset + size] = True
    fixed = ~varying
    if np.any(table[:, fixed] != table[0, fixed]):
        return None
    wall_times = np.ascontiguousarray(table[:, 1:9]).view("<f8")[:, 0]
    steps = np.zeros(len(records), np.int64)
    for index, column in enumerate(range(10, header_end)):
        steps |= (table[:, column].astype(np.int64) & 0x7F) << (7 * index)
    values = {}
    for tag, kind, offset, size, dtype in fields:
        if kind not in ("scalars", "histograms"):
            continue
        block = np.ascontiguousarray(table[:, offset : offset + size]).view(dtype)
        if kind == "scalars":
            values[tag] = (kind, block[:, 0].astype(np.float64))
        elif block.shape[1] % 3 == 0:
            values[tag] = (kind, block.astype(np.float32).reshape(len(records), -1, 3))
        else:
            return None
    return wall_times, steps, values
