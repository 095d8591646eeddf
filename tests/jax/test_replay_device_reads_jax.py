"""The JAX replay's counts and ranges made on the device (`device_reads`), against NumPy."""

import jax.numpy as jnp
import numpy as np

from kgrad.backends.common import locate
from kgrad.backends.jax.guard.device_reads import measured, readable


def _numpy(values):
    """``((nan, inf), finite range)`` of ``values`` by NumPy, in float64."""
    values = np.asarray(values).astype(np.float64)
    finite = values[np.isfinite(values)]
    found = (int(np.isnan(values).sum()), int(np.isinf(values).sum()))
    return found, (float(finite.min()), float(finite.max())) if finite.size else None


def test_measured_counts_and_ranges_as_numpy_does():
    rng = np.random.default_rng(0)
    mixed = rng.normal(size=(3, 5)).astype(np.float32)
    mixed[0, 1], mixed[2, 4], mixed[1, 0] = np.nan, np.inf, -np.inf
    leaves = [
        mixed,
        jnp.asarray(rng.normal(size=(4,)), jnp.bfloat16),
        np.full((2, 2), np.nan, np.float32),  # no finite value: no range
        np.arange(6).reshape(2, 3),  # not floating point: nothing to count
        jnp.asarray([[1e30, -3e38], [2.0, 0.5]], jnp.float32),
    ]
    got = measured(leaves)
    assert all(isinstance(one, locate.Measured) for one in got)
    for leaf, one in zip(leaves[:3] + leaves[4:], got[:3] + got[4:]):
        found, value_range = _numpy(np.asarray(leaf, np.float32))
        assert one.nan_inf == found
        assert one.finite_range == value_range
    assert got[2].nan_inf == (4, 0) and got[2].finite_range is None
    assert got[3] == locate.Measured((0, 0), None)


def test_the_rules_name_the_same_weight_and_input_from_measures_as_from_arrays():
    weights = [("a/kernel", np.ones((2, 2), np.float32)),
               ("b/kernel", np.array([1.0, np.inf], np.float32))]
    measures = measured([values for _, values in weights])
    from_device = [(path, one) for (path, _), one in zip(weights, measures)]
    assert locate.in_weights(from_device) == locate.in_weights(weights)
    assert locate.in_weights(from_device)["born_at"] == "b/kernel"
    inputs = {"left": np.zeros((2, 1), np.float32), "right": np.array([[np.nan], [-2.0]], np.float32)}
    measures = dict(zip(inputs, measured(list(inputs.values()))))
    assert locate.in_data(measures, None, None) == locate.in_data(inputs, None, None)
    assert locate.in_data(measures, None, None)["born_input_range"] == (-2.0, -2.0)


def test_readable_gives_host_arrays_of_the_same_structure():
    arrays = {"counts": jnp.asarray([1, 2], jnp.int32), "nested": [jnp.float32(3.5)]}
    read = readable(arrays)
    assert isinstance(read["counts"], np.ndarray) and read["counts"].tolist() == [1, 2]
    assert float(read["nested"][0]) == 3.5
