"""The reductions of every tensor a probed step summarizes, in a constant number of kernels.

Outside XLA (`kgrad.backends.tensorflow.summarize.blocks`), every tensor's five
reductions and log-magnitude counts are a few kernels over the rows of one
matrix of all the tensors, one call in the step's graph, nothing compiled.
Inside an XLA step, the same reductions are built inline for each tensor
(XLA fuses each into a loop over it) and the bucket keys of all of them are
counted by one segment sum.

Sums inside XLA are taken by blocks of `BLOCK` elements then over the
blocks: a float32 sum of a long vector, one element after another, loses
digits as it grows (the reference tests ask for 1e-4 at any size).

Example:

>>> import tensorflow as tf
>>> rows, counts = reductions([tf.constant([-1.0, 0.0, 2.0])], with_counts=True)
>>> rows[0, 3:5].numpy().tolist(), int(tf.reduce_sum(counts))  # min, max; elements counted
([-1.0, 2.0], 3)
"""

import functools

import tensorflow as tf

from kgrad.backends.tensorflow.summarize import blocks
from kgrad.backends.tensorflow.summarize.log_buckets import counts_of_keys, in_xla, offset_keys

#: Elements summed one after another, inside XLA, before the blocks' sums are added.
BLOCK = 4096

#: The columns of `reductions`' rows.
COLUMNS = blocks.COLUMNS


def _blocked_sum(values):
    whole = tf.size(values) // BLOCK * BLOCK
    block_sums = tf.reduce_sum(tf.reshape(values[:whole], [-1, BLOCK]), axis=1)
    return tf.reduce_sum(block_sums) + tf.reduce_sum(values[whole:])


def _row(tensor):
    values = tf.reshape(tf.cast(tensor, tf.float32), [-1])
    return tf.stack([
        tf.cast(tf.size(values), tf.float32),
        _blocked_sum(tf.square(values)),
        _blocked_sum(values),
        tf.reduce_min(values),
        tf.reduce_max(values),
        tf.cast(tf.reduce_sum(tf.cast(tf.not_equal(values, 0.0), tf.int32)), tf.float32),
    ])


def reductions(tensors, with_counts):
    """``(rows, counts)`` of a non-empty list of float tensors of any shapes.

    The arguments and results of `kgrad.backends.tensorflow.summarize.blocks.reductions`
    (inside XLA, an empty tensor's min and max are +Inf and -Inf).
    """
    if not in_xla():
        return blocks.reductions(tensors, with_counts)
    rows = tf.stack([_row(tensor) for tensor in tensors])
    if not with_counts:
        return rows, tf.zeros([len(tensors), 0], tf.int32)
    return rows, counts_of_keys(offset_keys(tensors), len(tensors))


def sums_of_squares(tensors):
    """``[n]`` float32 sums of squares of a non-empty list of float tensors.

    What a tensor of which only the norm is written needs
    (`kgrad.backends.tensorflow.summarize.norms.norms_many`).

    >>> import tensorflow as tf
    >>> sums_of_squares([tf.constant([3.0, 4.0]), tf.constant([[1.0]])]).numpy().tolist()
    [25.0, 1.0]
    """
    if not in_xla():
        return blocks.sums_of_squares(tensors)
    return tf.stack([_blocked_sum(tf.square(tf.reshape(tf.cast(t, tf.float32), [-1]))) for t in tensors])


def _split_squares(flat, sizes):
    # Split along the first axis shares the flat tensor's memory: one pass.
    return tf.stack([2.0 * tf.nn.l2_loss(piece) for piece in tf.split(flat, list(sizes))])


@functools.lru_cache(maxsize=None)
def _split_function(sizes):
    return tf.function(
        functools.partial(_split_squares, sizes=sizes),
        autograph=False,
        experimental_attributes={"_noinline": True},
    )


def split_sums_of_squares(flat, sizes):
    """``[len(sizes)]`` sums of squares of consecutive pieces of the flat float32 ``flat``.

    What `kgrad.backends.tensorflow.summarize.weight_snapshots` needs of the
    weights it concatenated: a segment sum over them was a scatter of every
    entry, the most costly op of a probed MLP step (53% of the op time it
    added). Here one fused kernel per piece, in one function that is not
    inlined (one call in the step's graph).

    >>> import tensorflow as tf
    >>> split_sums_of_squares(tf.constant([3.0, 4.0, 1.0]), [2, 1]).numpy().tolist()
    [25.0, 1.0]
    """
    sizes = tuple(int(size) for size in sizes)
    if in_xla() or tf.executing_eagerly():
        return _split_squares(flat, sizes)
    return _split_function(sizes)(flat)
