"""The reductions of every tensor a probed step summarizes, in one XLA-compiled call.

Without XLA, each reduction of each tensor is a TensorFlow op: five or six per
tensor for the moments, a few more for a histogram, so a probed step's ops
grew with the number of layers and each paid its launch. Here the same
reductions of all the tensors are one function that XLA compiles
(``jit_compile=True``, even inside a step that is not compiled): one call in
the step's graph whatever the number of tensors, each tensor's reductions
fused into a loop over it, and its log-magnitude bucket keys
(`kgrad.backends.tensorflow.summarize.log_buckets`) computed in the same call.
The tensors of a TensorFlow step are on one device, so one call may read them
all; nothing is concatenated but the integer keys.

Sums are taken by blocks of `BLOCK` elements then over the blocks: a float32
sum of a long vector, one element after another, loses digits as it grows
(the reference tests ask for 1e-4 at any size); the count of nonzero elements
is an integer sum, exact at any size.

Example:

>>> import tensorflow as tf
>>> rows, keys = reductions([tf.constant([[3.0, 4.0]]), tf.constant([0.0])], with_keys=False)
>>> rows.numpy().tolist()  # size, sum of squares, sum, min, max, nonzero count
[[2.0, 25.0, 7.0, 3.0, 4.0, 2.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
"""

import functools

import tensorflow as tf

from kgrad.backends.tensorflow.summarize.log_buckets import in_xla, offset_keys

#: Elements summed one after another before the blocks' sums are added.
BLOCK = 4096

#: The columns of `reductions`' rows.
COLUMNS = ("size", "squares", "sum", "minimum", "maximum", "nonzeros")


def _blocked_sum(values):
    whole = tf.size(values) // BLOCK * BLOCK
    blocks = tf.reduce_sum(tf.reshape(values[:whole], [-1, BLOCK]), axis=1)
    return tf.reduce_sum(blocks) + tf.reduce_sum(values[whole:])


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


def _moments(tensors):
    return tf.stack([_row(tensor) for tensor in tensors]), tf.zeros([0], tf.int32)


def _moments_and_keys(tensors):
    return tf.stack([_row(tensor) for tensor in tensors]), offset_keys(tensors)


def _squares(tensors):
    return tf.stack([_blocked_sum(tf.square(tf.reshape(tf.cast(t, tf.float32), [-1]))) for t in tensors])


@functools.lru_cache(maxsize=None)
def _compiled(function):
    return tf.function(function, jit_compile=True, autograph=False)


def _call(function, tensors):
    # Inside an XLA step the ops are built inline; eagerly they run as they
    # are (no compile per call of a test).
    if in_xla() or tf.executing_eagerly():
        return function(tensors)
    return _compiled(function)(list(tensors))


def _split_squares(tensors, sizes):
    pieces = tf.split(tensors[0], list(sizes))
    return tf.stack([tf.reduce_sum(tf.square(piece)) for piece in pieces])


@functools.lru_cache(maxsize=None)
def _compiled_split(sizes):
    return tf.function(functools.partial(_split_squares, sizes=sizes), jit_compile=True, autograph=False)


def split_sums_of_squares(flat, sizes):
    """``[len(sizes)]`` sums of squares of consecutive pieces of the flat float32 ``flat``, in one compiled call.

    What `kgrad.backends.tensorflow.summarize.weight_snapshots` needs of the
    weights it concatenated: a segment sum over them was a scatter of every
    entry, the most costly op of a probed MLP step (53% of the op time it added).

    >>> import tensorflow as tf
    >>> split_sums_of_squares(tf.constant([3.0, 4.0, 1.0]), [2, 1]).numpy().tolist()
    [25.0, 1.0]
    """
    sizes = tuple(int(size) for size in sizes)
    if in_xla() or tf.executing_eagerly():
        return _split_squares([flat], sizes)
    return _compiled_split(sizes)([flat])


def sums_of_squares(tensors):
    """``[n]`` float32 sums of squares of a non-empty list of float tensors, in one compiled call.

    What a tensor of which only the norm is written needs
    (`kgrad.backends.tensorflow.summarize.norms.norms_many`).

    >>> import tensorflow as tf
    >>> sums_of_squares([tf.constant([3.0, 4.0]), tf.constant([[1.0]])]).numpy().tolist()
    [25.0, 1.0]
    """
    return _call(_squares, tensors)


def reductions(tensors, with_keys):
    """``(rows, keys)`` of a non-empty list of float tensors of any shapes.

    Args:
        tensors: The tensors, of any float dtype (reduced in float32).
        with_keys: Whether to compute their log-magnitude bucket keys.

    Returns:
        ``rows``: a ``[n, 6]`` float32 tensor of `COLUMNS` per tensor (the min
        and max of an empty tensor are +Inf and -Inf; with a NaN, the min,
        max and sums are not meaningful: the caller's careful branch takes
        over). ``keys``: `kgrad.backends.tensorflow.summarize.log_buckets.offset_keys`
        of the tensors (empty without ``with_keys``).
    """
    return _call(_moments_and_keys if with_keys else _moments, tensors)
