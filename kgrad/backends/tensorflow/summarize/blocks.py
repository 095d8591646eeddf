"""The reductions of every tensor a probed step summarizes, as rows of one matrix, with TensorFlow's kernels.

Without XLA, each reduction of each tensor was a TensorFlow kernel: five or
six per tensor for the moments, a few more for a histogram, so a probed
step's kernels grew with the number of layers and each paid its launch.
Here every tensor is flattened and padded with zeros to whole rows of
`BLOCK` elements, and the rows of all tensors are one ``[rows, BLOCK]``
matrix (the tensors of a TensorFlow step are on one device: one copy of
them, no transfer). Each reduction is then one kernel over all the rows,
followed by a reduction of each tensor's rows (a few thousand numbers); the
log-magnitude bucket keys (`kgrad.backends.tensorflow.summarize.log_buckets`)
are computed and counted by one ``bincount`` `CHUNK_ROWS` rows at a time, in
one loop. Apart from a reshape of each tensor and its padding (which copy
nothing but the padding), the kernels a call runs do not depend on the
number of tensors, and nothing is compiled: XLA's compile of such a program grew with
the number of tensors and cost a small model's fit 0.2-0.3 GB of peak memory
(benchmarks/RESULTS.md). The work is one function that is not inlined, one
call in the step's graph.

The zeros of the padding add nothing to a sum, a sum of squares or a count
of nonzero elements; they are taken out of each tensor's zero bucket, and
each tensor's last row is reduced again without them for its min and max.
A sum is TensorFlow's blocked float32 reduction of each row, then a sum of
a tensor's rows in float64: within 1e-5 of float64 at a million elements
(tested).

Example:

>>> import tensorflow as tf
>>> rows, counts = reductions([tf.constant([[3.0, 4.0]]), tf.constant([0.0])], with_counts=False)
>>> rows.numpy().tolist()  # size, sum of squares, sum, min, max, nonzero count
[[2.0, 25.0, 7.0, 3.0, 4.0, 2.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
"""

import functools

import numpy as np
import tensorflow as tf

from kgrad.backends.tensorflow.summarize.log_buckets import KEYS_PER_TENSOR, bucket_keys
from kgrad.plan.histogram_buckets import BUCKETS_PER_SIDE, LOG_BUCKET_COUNT

#: Elements per row of the matrix of all tensors (each tensor's padding is under one row:
#: rows of 1024 padded each 32-element bias of the benchmark transformer to 32 times its size).
BLOCK = 256

#: Rows whose bucket keys are computed and counted at a time (a 1 MB chunk).
CHUNK_ROWS = 1024

#: The columns of `reductions`' rows.
COLUMNS = ("size", "squares", "sum", "minimum", "maximum", "nonzeros")


class _Layout:
    """All tensors as rows of one zero-padded ``[rows, BLOCK]`` float32 matrix.

    Attributes:
        matrix: The rows.
        owner: ``[rows]`` int32, the tensor each row holds.
        sizes: ``[n]`` int32 elements of each tensor.
        padding: ``[n]`` int32 zeros added after each tensor.
        last_rows: ``[n]`` int32, each tensor's last row (every tensor has one,
            an empty tensor a row of padding).
    """

    def __init__(self, tensors):
        flats = [tf.reshape(tf.cast(tensor, tf.float32), [-1]) for tensor in tensors]
        static = [flat.shape.num_elements() for flat in flats]
        if all(size is not None for size in static):
            # Known sizes (the usual case): the layout is constants.
            sizes = np.array(static, np.int32)
            rows = np.maximum(-(-sizes // BLOCK), 1)
            pieces = []
            for flat, pad in zip(flats, rows * BLOCK - sizes):
                pieces += [flat, tf.zeros([pad], tf.float32)] if pad else [flat]
            owner = np.repeat(np.arange(len(flats), dtype=np.int32), rows)
            to_tensor = tf.constant
        else:
            sizes = tf.stack([tf.size(flat) for flat in flats])
            rows = tf.maximum((sizes + BLOCK - 1) // BLOCK, 1)
            pads = tf.unstack(rows * BLOCK - sizes)
            pieces = [piece for flat, pad in zip(flats, pads) for piece in (flat, tf.zeros([pad]))]
            owner = tf.repeat(tf.range(len(flats), dtype=tf.int32), rows)
            to_tensor = tf.convert_to_tensor
        self.matrix = tf.reshape(tf.concat(pieces, axis=0), [-1, BLOCK])
        self.owner = to_tensor(owner)
        self.sizes = to_tensor(sizes)
        self.padding = to_tensor(rows * BLOCK - sizes)
        self.last_rows = to_tensor(np.cumsum(rows) - 1 if to_tensor is tf.constant else tf.cumsum(rows) - 1)
        self.count = len(flats)

    def per_tensor(self, row_values, segment_reduction):
        """``[n]`` reductions of each tensor's ``[rows]`` row values."""
        return segment_reduction(row_values, self.owner, self.count)

    def squares(self):
        """``[n]`` float32 sums of squares of each tensor (Inf when a square overflows)."""
        # One fused kernel (a square and a sum took two passes and twice the time).
        return self.sums(tf.square(tf.math.reduce_euclidean_norm(self.matrix, axis=1)))

    def sums(self, row_sums):
        """``[n]`` float32 sums of each tensor's ``[rows]`` float32 row sums, added in float64.

        Added one after another in float32, a thousand rows' sums lost a
        digit of a million elements' (and twenty times more of their variance).
        """
        return tf.cast(self.per_tensor(tf.cast(row_sums, tf.float64), tf.math.unsorted_segment_sum), tf.float32)

    def extremes(self):
        """``(minimum, maximum)``: ``[n]`` each (float32's largest and lowest for an empty tensor)."""
        # The padding's zeros are in each tensor's last row only: those rows
        # are reduced again with the padding masked, and replace their row's.
        last = tf.gather(self.matrix, self.last_rows)
        valid = tf.range(BLOCK)[tf.newaxis] < (BLOCK - self.padding)[:, tf.newaxis]
        where = self.last_rows[:, tf.newaxis]
        extremes = []
        for reduce, masked, segment in (
            (tf.reduce_min, np.inf, tf.math.unsorted_segment_min),
            (tf.reduce_max, -np.inf, tf.math.unsorted_segment_max),
        ):
            last_value = reduce(tf.where(valid, last, masked), axis=1)
            row_values = tf.tensor_scatter_nd_update(reduce(self.matrix, axis=1), where, last_value)
            extremes.append(self.per_tensor(row_values, segment))
        return tuple(extremes)

    def bucket_counts(self):
        """``[n, LOG_BUCKET_COUNT]`` int32 log-magnitude counts of each tensor (NaN and Inf in none)."""
        total = self.count * KEYS_PER_TENSOR

        def count_chunk(start, counts):
            # The keys' temporaries (five of the chunk's size) are of one chunk
            # at a time: of all the rows at once they cost a CNN's probed fit
            # 45 MB more peak memory than the per-tensor kernels did.
            rows = slice(start, start + CHUNK_ROWS)
            keys = bucket_keys(self.matrix[rows]) + (self.owner[rows] * KEYS_PER_TENSOR)[:, tf.newaxis]
            # Integer counts: a float32 count stops growing at 2**24 elements.
            chunk_counts = tf.math.bincount(
                tf.reshape(keys, [-1]), minlength=total, maxlength=total, dtype=tf.int32
            )
            return start + CHUNK_ROWS, counts + chunk_counts

        _, counts = tf.while_loop(
            lambda start, _: start < tf.shape(self.matrix)[0],
            count_chunk,
            [tf.constant(0), tf.zeros([total], tf.int32)],
            parallel_iterations=1,
        )
        counts = tf.reshape(counts, [self.count, KEYS_PER_TENSOR])[:, : int(LOG_BUCKET_COUNT)]
        # The padding's zeros are in the zero bucket: taken out.
        padding = tf.one_hot(BUCKETS_PER_SIDE, int(LOG_BUCKET_COUNT), dtype=tf.int32) * self.padding[:, tf.newaxis]
        return counts - padding


def _moments(tensors):
    return _reductions(tensors, with_counts=False)


def _moments_and_counts(tensors):
    return _reductions(tensors, with_counts=True)


def _reductions(tensors, with_counts):
    layout = _Layout(tensors)
    matrix = layout.matrix
    squares = layout.squares()
    total = layout.sums(tf.reduce_sum(matrix, axis=1))
    minimum, maximum = layout.extremes()
    size = tf.cast(layout.sizes, tf.float32)
    if with_counts:
        counts = layout.bucket_counts()
        # The zero bucket holds the zeros (and the subnormals, which
        # TensorFlow's CPU kernels compare as zeros): no other pass for them.
        nonzeros = size - tf.cast(counts[:, BUCKETS_PER_SIDE], tf.float32)
    else:
        counts = tf.zeros([len(tensors), 0], tf.int32)
        # Exact: at most BLOCK ones per row, then added in float64.
        nonzeros = layout.sums(tf.reduce_sum(tf.cast(tf.not_equal(matrix, 0.0), tf.float32), axis=1))
    return tf.stack([size, squares, total, minimum, maximum, nonzeros], axis=1), counts


def _sums_of_squares(tensors):
    return _Layout(tensors).squares()


@functools.lru_cache(maxsize=None)
def _function(python_function):
    # Not inlined: one call op in the step's graph, traced once per model
    # (per list of tensor shapes), whatever the number of tensors.
    return tf.function(python_function, autograph=False, experimental_attributes={"_noinline": True})


def _call(python_function, tensors):
    if tf.executing_eagerly():
        return python_function(list(tensors))  # no trace per call of a test
    return _function(python_function)(list(tensors))


@tf.autograph.experimental.do_not_convert
def reductions(tensors, with_counts):
    """``(rows, counts)`` of a non-empty list of float tensors of any shapes, outside XLA.

    Args:
        tensors: The tensors, of any float dtype (reduced in float32).
        with_counts: Whether to count their log-magnitude buckets.

    Returns:
        ``rows``: a ``[n, 6]`` float32 tensor of `COLUMNS` per tensor (the min
        and max of an empty tensor are not its own: +-Inf, or float32's largest
        and lowest outside XLA; with a NaN or Inf, the
        min, max and sums are not meaningful: the caller's careful branch
        takes over). ``counts``: ``[n, LOG_BUCKET_COUNT]`` int32 counts
        (``[n, 0]`` without ``with_counts``).
    """
    return _call(_moments_and_counts if with_counts else _moments, tensors)


@tf.autograph.experimental.do_not_convert
def sums_of_squares(tensors):
    """``[n]`` float32 sums of squares of a non-empty list of float tensors, outside XLA.

    >>> import tensorflow as tf
    >>> sums_of_squares([tf.constant([3.0, 4.0]), tf.constant([[1.0]])]).numpy().tolist()
    [25.0, 1.0]
    """
    return _call(_sums_of_squares, tensors)
