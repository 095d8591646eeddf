"""The bytes of a run's Summaries: serialized once per set of tags, then filled with each record's values.

TensorBoard reads scalars and histograms as ``TensorProto``s with the scalar
and histogram plugins' metadata; `ProbeWriter` writes the first record of a
run with those protos and later ones through a `SummaryLayout`.
"""

import numpy as np
from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2


class SummaryLayout:
    """The serialized Summary of records with the same tags, and where each value goes.

    Records of a run have the same tags, so their Summaries differ only in
    the bytes of the values: a float32 per scalar, the float64 buckets of
    each histogram, each at a fixed offset. Filling those bytes with NumPy
    costs a copy and one scatter per record, where setting the values of a
    proto costs ~1 µs each (thousands in a large model's record).

    Args:
        scalar_tags: Tags of the scalars, in record order.
        histograms: ``(tag, shape)`` of each histogram, in record order.
    """

    def __init__(self, scalar_tags, histograms):
        pieces, scalar_starts, self._histogram_spans = [], [], []
        size = source = 0
        for tag in scalar_tags:
            piece = _one_value_summary(tag, scalar_proto(_SCALAR_MARK))
            scalar_starts.append(size + _offset(piece, _SCALAR_MARK_BYTES))
            pieces.append(piece)
            size += len(piece)
        for tag, shape in histograms:
            mark = np.full(shape, _HISTOGRAM_MARK)
            piece = _one_value_summary(tag, histogram_proto(mark))
            if mark.size:
                start = size + _offset(piece, _histogram_bytes(mark))
                self._histogram_spans.append((start, source, mark.nbytes))
                source += mark.nbytes
            pieces.append(piece)
            size += len(piece)
        # Serialized messages concatenate: the pieces' values append in order.
        self._template = b"".join(pieces)
        scalar_starts = np.asarray(scalar_starts, np.int64)
        self._scalar_index = (scalar_starts[:, np.newaxis] + np.arange(4)).ravel()

    def fill(self, scalars, histograms):
        """The serialized Summary of float32 ``scalars`` and ``[k, 3]`` ``histograms``."""
        summary = bytearray(self._template)
        np.frombuffer(summary, np.uint8)[self._scalar_index] = np.asarray(scalars, "<f4").view(np.uint8)
        if self._histogram_spans:
            # One conversion for all histograms, then a copy of each into its place.
            buckets = np.concatenate([np.ravel(h) for h in histograms]).astype("<f8").view(np.uint8)
            memory = memoryview(summary)
            for start, source, size in self._histogram_spans:
                memory[start : start + size] = buckets[source : source + size]
        return bytes(summary)


# Values whose bytes cannot occur elsewhere in a piece: 0xFF is never part
# of a UTF-8 tag, and protobuf's short lengths and field keys never hold two
# in a row.
_SCALAR_MARK = np.float32(np.finfo(np.float32).max)
_SCALAR_MARK_BYTES = _SCALAR_MARK.astype("<f4").tobytes()
_HISTOGRAM_MARK = np.finfo(np.float64).max


def _one_value_summary(tag, tensor):
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, tensor=tensor)]).SerializeToString()


def _offset(piece, value_bytes):
    """Where ``value_bytes`` starts in ``piece``, which holds it exactly once."""
    if piece.count(value_bytes) != 1:
        raise AssertionError(f"kgrad: cannot place a value in the serialized Summary {piece!r}.")
    return piece.index(value_bytes)


# Tensor protos built directly: `tensor_util.make_tensor_proto` is general and
# costs tens of microseconds per value, hundreds of values per record.
SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()


def scalar_proto(value):
    """A float32 scalar TensorProto, as ``tf.summary.scalar`` writes it."""
    return tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, tensor_shape=SCALAR_SHAPE, float_val=[value]
    )


def histogram_proto(buckets):
    """A float64 ``[k, 3]`` TensorProto, as ``tf.summary.histogram`` writes it."""
    shape = tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=size) for size in np.shape(buckets)]
    )
    return tensor_pb2.TensorProto(
        dtype=types_pb2.DT_DOUBLE, tensor_shape=shape, tensor_content=_histogram_bytes(buckets)
    )


def _histogram_bytes(buckets):
    return np.ascontiguousarray(buckets, dtype=np.float64).tobytes()
