"""Log-magnitude bucket keys from a float's bits, and their counts.

A finite float32's log-magnitude bucket (`kgrad.plan.histogram_buckets`) is
a function of its bits: the sign, the exponent and the mantissa's top bits
say which bucket it is in, except in the few ranges of those bits that hold
an edge, where one integer comparison with the edge's bits decides (a
positive float's bits order as its value does, so that comparison is the
float comparison). Lookups in tables of 8192 entries and one comparison
per element, with no binary search, no logarithm and no rounding: each
element lands in the bucket of the rule, NaN and Inf in a bucket of their
own that is dropped.

Outside XLA, `kgrad.backends.tensorflow.summarize.blocks` computes the keys
of all the tensors of a call at once, as rows of one matrix, and counts them
with one ``bincount`` (a kernel per step of `bucket_keys`, not per tensor).
Inside an XLA step, `kgrad.backends.tensorflow.summarize.one_pass` builds
them per tensor, where they fuse into each tensor's loop, as one integer
vector (`offset_keys`: each tensor's keys offset by its index, concatenated;
the tensors of a TensorFlow step are on one device), counted by one segment
sum (`counts_of_keys`).

Example:

>>> import tensorflow as tf
>>> counts = counts_of_keys(offset_keys([tf.constant([0.0, 1.0, -1.0, float("nan")])]), 1)
>>> counts.shape, int(tf.reduce_sum(counts))  # the NaN is in no bucket
(TensorShape([1, 65]), 3)
"""

import functools

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from kgrad.plan.histogram_buckets import (
    BUCKETS_PER_SIDE,
    LOG_BUCKET_COUNT,
    MAGNITUDE_EDGES,
    SMALLEST_NORMAL,
)

#: Bits below the table index: sign, exponent and the mantissa's top 4 bits index the tables.
_LOW_BITS = 19
#: Keys per tensor: the buckets, then one for NaN and Inf (dropped).
KEYS_PER_TENSOR = int(LOG_BUCKET_COUNT) + 1
_MAGNITUDE_BITS = 0x7FFFFFFF


def in_xla():
    """Whether the graph being built is compiled by XLA (an XLA step, or a function inside one)."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _bits(value):
    return int(np.array(value, np.float32).view(np.int32))


@functools.lru_cache(maxsize=None)
def bucket_tables():
    """``(below, above, edge)``: int32 tables indexed by a float32's bits >> 19.

    A value ``v`` with ``i = bits(v) >> 19`` is in bucket ``above[i]`` when
    its bits, as a signed int32, are ``>= edge[i]``, else ``below[i]``; a NaN
    or Inf is in bucket ``LOG_BUCKET_COUNT``. A negative float's int32 bits
    are its magnitude's minus 2**31, so its edge is stored so too: one
    signed comparison for both signs. Checked against the binary search of
    `kgrad.plan.histogram_buckets.signed_boundaries` on every edge and its
    float32 neighbours (tests/test_log_histograms.py).
    """
    size = 1 << (32 - _LOW_BITS)
    half = size // 2
    # Magnitude bits at the start of each index's range (the sign bit cleared).
    starts = (np.arange(half, dtype=np.int64) << _LOW_BITS).astype(np.int64)
    edge_bits = np.array([_bits(edge) for edge in MAGNITUDE_EDGES[1:BUCKETS_PER_SIDE]], np.int64)
    # Within its side, the bucket of a magnitude m is how many edges are <= m.
    below = np.searchsorted(edge_bits, starts, side="right")
    # One edge at most lies inside a range (edges are a factor 10**0.5 apart, a range at most 1 + 2**-4).
    inside = np.full(half, _MAGNITUDE_BITS, np.int64)
    for bits in edge_bits:
        index = bits >> _LOW_BITS
        if bits > starts[index]:
            inside[index] = bits
    zero = starts < _bits(SMALLEST_NORMAL)  # 0 and the subnormals
    nonfinite = starts >= _bits(np.inf)
    positive = np.where(zero, BUCKETS_PER_SIDE, BUCKETS_PER_SIDE + 1 + below)
    negative = np.where(zero, BUCKETS_PER_SIDE, BUCKETS_PER_SIDE - 1 - below)
    positive = np.where(nonfinite, int(LOG_BUCKET_COUNT), positive)
    negative = np.where(nonfinite, int(LOG_BUCKET_COUNT), negative)
    has_edge = inside != _MAGNITUDE_BITS
    lower = np.concatenate([positive, negative])
    upper = np.concatenate([np.where(has_edge, positive + 1, positive), np.where(has_edge, negative - 1, negative)])
    # No negative int32 reaches the positive _MAGNITUDE_BITS: a range without an edge stays below.
    edge = np.concatenate([inside, np.where(has_edge, inside - (1 << 31), _MAGNITUDE_BITS)])
    return lower.astype(np.int32), upper.astype(np.int32), edge.astype(np.int32)


def bucket_keys(values):
    """The log-magnitude bucket of each element of float32 ``values`` (any shape); NaN and Inf: ``LOG_BUCKET_COUNT``.

    TensorFlow kernels, each one pass: a shift, two lookups in tables of 8192
    entries (``gather_nd``: 40% less time than ``gather`` on CPU), a
    comparison, and the key of each side of the edge unpacked and selected.
    """
    lower, upper, edge = bucket_tables()
    both_keys = tf.constant(lower | (upper << 8))
    # The table index: the bits shifted as unsigned (the sign bit is the index's top bit).
    index = tf.bitwise.right_shift(tf.bitcast(values, tf.uint32), tf.constant(_LOW_BITS, tf.uint32))
    index = tf.bitcast(index, tf.int32)[..., tf.newaxis]
    beyond_edge = tf.bitcast(values, tf.int32) >= tf.gather_nd(tf.constant(edge), index)
    keys = tf.gather_nd(both_keys, index)
    return tf.where(beyond_edge, tf.bitwise.right_shift(keys, 8), tf.bitwise.bitwise_and(keys, 0xFF))


def offset_keys(tensors):
    """One int32 vector of the bucket keys of each tensor, tensor ``i``'s offset by ``i * (LOG_BUCKET_COUNT + 1)``.

    Each tensor's keys in a range of its own, all in one vector for one count (`counts_of_keys`).
    """
    return tf.concat(
        [
            bucket_keys(tf.reshape(tf.cast(tensor, tf.float32), [-1])) + index * KEYS_PER_TENSOR
            for index, tensor in enumerate(tensors)
        ],
        axis=0,
    )


def counts_of_keys(keys, count):
    """``[count, LOG_BUCKET_COUNT]`` int32 counts of `offset_keys` of ``count`` tensors; NaN and Inf dropped."""
    if in_xla():
        counts = tf.math.unsorted_segment_sum(tf.ones_like(keys), keys, count * KEYS_PER_TENSOR)
    else:
        # Several times faster than a scatter on CPU. Integer counts: a float32
        # count stops growing at 2**24 elements.
        counts = tf.math.bincount(keys, minlength=count * KEYS_PER_TENSOR, maxlength=count * KEYS_PER_TENSOR, dtype=tf.int32)
    return tf.reshape(counts, [count, KEYS_PER_TENSOR])[:, :-1]
