"""Counts of a sharded tensor's elements, counted where its shards live and summed across the mesh.

Under a ``keras.distribution`` a statistic of a sharded tensor must be local
partial results and a reduction of those small results (issue 52). XLA's
partitioner does that for a plain sum, but not for a reduction of several
operands (the log-magnitude histogram's 65 counts): it gathers every
device's partial results of every operand, thousands of small all-gathers
in a probed step. `counted_where_they_live` states the rule itself with
``jax.experimental.custom_partitioning``: each device counts its own shard,
and the counts are summed (``psum``) over the mesh axes the tensor is split
on, and only those (a replica holds the same elements: summing over its axis
would count them twice). Where a dimension does not divide evenly, XLA pads
the last shards; the padding is masked out before counting.

Example (on one device there is no mesh: the counts are the local ones):

>>> import jax.numpy as jnp
>>> counted_where_they_live(lambda shard: jnp.sum(shard > 0, dtype=jnp.int32)[None],
...                         jnp.array([[1.0, -1.0], [2.0, 3.0]])).tolist()
[3]
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

#: Factor names of the partitioner's rule, one per dimension, and the counts' own.
_FACTORS, _COUNTS_FACTOR = "abcdefghijklmnopqrstuvwxy", "z"


def counted_where_they_live(local_counts, values):
    """``local_counts`` of every device's shard of ``values``, summed over the axes it is split on.

    Args:
        local_counts: A function of a float array of any shape (a shard, its
            padding set to NaN) to a 1-D int32 array of counts, with no
            element counted twice and NaN counted nowhere.
        values: A float array, at most 25 dimensions.
    """
    if not 1 <= values.ndim <= len(_FACTORS):
        return local_counts(values)
    # Counts have no derivative; a custom partitioning has no rule for one either, and a
    # statistic of an activation is computed inside the differentiated pass.
    return _partitioned(local_counts, values.ndim)(jax.lax.stop_gradient(values))


@functools.cache
def _partitioned(local_counts, ndim):
    @custom_partitioning
    def counts(values):
        return local_counts(values)

    def partition(mesh, arg_shapes, result_shape):
        del result_shape
        sharding = arg_shapes[0].sharding
        split = _split_axes(sharding, ndim)
        global_shape = arg_shapes[0].shape
        axes = tuple(axis for dimension_axes in split for axis in dimension_axes)

        def per_device(shard):
            local = local_counts(_padding_as_nan(shard, global_shape, split, mesh.shape))
            return jax.lax.psum(local, axes) if axes else local

        return mesh, per_device, NamedSharding(mesh, PartitionSpec()), (sharding,)

    def replicated(mesh, arg_shapes, result_shape):
        del arg_shapes, result_shape
        return NamedSharding(mesh, PartitionSpec())

    rule = f"{' '.join(_FACTORS[:ndim])} -> {_COUNTS_FACTOR}"
    counts.def_partition(partition, infer_sharding_from_operands=replicated, sharding_rule=rule)
    return counts


def _split_axes(sharding, ndim):
    """Per dimension, the tuple of mesh axes it is split on (major first)."""
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    return [() if entry is None else (entry,) if isinstance(entry, str) else tuple(entry) for entry in spec]


def _padding_as_nan(shard, global_shape, split, mesh_shape):
    """``shard`` with the elements beyond ``global_shape`` (XLA's padding of uneven shards) set to NaN."""
    valid = None
    for dimension, axes in enumerate(split):
        if global_shape[dimension] % math.prod(mesh_shape[axis] for axis in axes) == 0:
            continue  # split evenly (or not at all): no padding
        index = 0
        for axis in axes:  # the shard's position along this dimension, the major axis first
            index = index * mesh_shape[axis] + jax.lax.axis_index(axis)
        within = jax.lax.broadcasted_iota(jnp.int32, shard.shape, dimension)
        positions = index * shard.shape[dimension] + within
        inside = positions < global_shape[dimension]
        valid = inside if valid is None else valid & inside
    return shard if valid is None else jnp.where(valid, shard, jnp.nan)
