"""What the JAX replay reads back to the host: small results counted on the devices, readable on every host.

The replay (`kgrad.backends.jax.guard.trace`) never reads a weight, a batch
or an activation to the host: it counts NaN/Inf and the finite range of each
where the values live (`counts`, `finite_range`: reductions, no reshape or
concatenation that would move elements between devices) and reads only those
few numbers. With several JAX processes a result of a program over the mesh
may span the devices of other processes, which JAX refuses to read on a host
that does not hold all of it: `readable` first makes each such result
replicated on its devices (an all-gather of a few numbers), so that every
process reads the same values and runs the same rules.

Example:

>>> import numpy as np
>>> [(m.nan_inf, m.finite_range) for m in measured([np.array([1.0, np.nan, -2.0]), np.arange(3)])]
[((1, 0), (-2.0, 1.0)), ((0, 0), None)]
"""

import jax
import jax.numpy as jnp
import numpy as np

from kgrad.backends.common import locate
from kgrad.backends.common.model_io import is_float


def counts(leaves):
    """``[nan, inf]`` over ``leaves`` (int32), on the device."""
    if not leaves:
        return jnp.zeros((2,), jnp.int32)
    return jnp.stack([sum(jnp.sum(jnp.isnan(leaf)) for leaf in leaves),
                      sum(jnp.sum(jnp.isinf(leaf)) for leaf in leaves)]).astype(jnp.int32)


def finite_range(leaves):
    """``[min, max, has any]`` of the finite values of ``leaves`` (float32), on the device.

    Each leaf is reduced where it lies, then the leaves' results: no leaf is
    flattened or concatenated (on a mesh, that would move its elements).
    """
    if not leaves:
        return jnp.zeros((3,), jnp.float32)
    ranges = []
    for leaf in leaves:
        values = leaf.astype(jnp.float32)
        finite = jnp.isfinite(values)
        ranges.append(jnp.stack([
            jnp.min(jnp.where(finite, values, jnp.inf)), jnp.max(jnp.where(finite, values, -jnp.inf)),
            jnp.any(finite).astype(jnp.float32),
        ]))
    ranges = jnp.stack(ranges)
    return jnp.stack([jnp.min(ranges[:, 0]), jnp.max(ranges[:, 1]), jnp.max(ranges[:, 2])])


def measured(leaves):
    """A `kgrad.backends.common.locate.Measured` per leaf (NaN/Inf, finite range), counted on the devices.

    Args:
        leaves: Arrays (device or host); a leaf that is not floating point has
            no NaN/Inf and no range.
    """
    floats = [index for index, leaf in enumerate(leaves) if is_float(leaf)]
    results = [locate.Measured((0, 0), None) for _ in leaves]
    if not floats:
        return results

    @jax.jit
    def measure(values):
        return (jnp.stack([counts([leaf]) for leaf in values]),
                jnp.stack([finite_range([leaf]) for leaf in values]))

    nan_inf, ranges = readable(measure([leaves[index] for index in floats]))
    for index, found, value_range in zip(floats, nan_inf, ranges):
        finite = (float(value_range[0]), float(value_range[1])) if value_range[2] else None
        results[index] = locate.Measured((int(found[0]), int(found[1])), finite)
    return results


def readable(arrays):
    """``jax.device_get(arrays)``, each array another process holds part of first replicated on its devices.

    For small results only (counts, ranges): every process gets the whole of
    each. All processes call it together (with several, it runs a program over the mesh).
    """
    leaves, structure = jax.tree_util.tree_flatten(arrays)
    spread = [index for index, leaf in enumerate(leaves)
              if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable]
    if spread:
        shardings = [_replicated(leaves[index]) for index in spread]
        replicate = jax.jit(lambda *values: values, out_shardings=tuple(shardings))
        gathered = replicate(*(leaves[index] for index in spread))
        for index, value in zip(spread, gathered):
            leaves[index] = value
    return jax.tree_util.tree_unflatten(structure, [np.asarray(leaf) for leaf in jax.device_get(leaves)])


def _replicated(array):
    """A sharding that puts the whole of ``array`` on each of the devices that hold its parts."""
    devices = sorted(array.sharding.device_set, key=lambda device: device.id)
    mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
