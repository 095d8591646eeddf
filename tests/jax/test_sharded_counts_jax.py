"""Histograms of sharded tensors counted where the shards live: exact, with one all-reduce and no gather.

On 8 CPU devices, in a subprocess (tests/scripts/sharded_counts_jax.py: the
number of host devices is fixed when JAX starts). Each device counts its own
shard, padding masked out, and the counts are summed over the mesh axes the
tensor is split on (issue 52), against NumPy's counts of the whole tensor.
"""

import numpy as np
import pytest
from device_scripts import run_script
from histogram_reference import log_magnitude_counts


@pytest.fixture(scope="module")
def measured():
    return run_script("sharded_counts_jax.py")[0]


def test_each_split_counts_what_numpy_counts_with_one_all_reduce_and_no_gather(measured):
    splits = measured["shapes"]
    assert len(splits) == 8
    for split in splits:
        values = np.asarray(split["values"], np.float32)
        special = np.isnan(values).any(), np.isposinf(values).any(), np.isneginf(values).any()
        assert all(special), split["spec"]
        np.testing.assert_array_equal(split["counts"], log_magnitude_counts(values), err_msg=split["spec"])
        assert split["collectives"] == {"all-gather": 0, "all-reduce": 1}, split


def test_a_sharded_probed_fit_counts_by_the_shards_as_by_scattering(measured):
    reduced, scattered = measured["fits"]["reduced"], measured["fits"]["scattered"]
    assert len(reduced) == len(scattered) == 2  # two probed steps
    for by_shards, by_scatter in zip(reduced, scattered):
        assert by_shards.keys() == by_scatter.keys() and len(by_shards) > 5
        for tag in by_shards:
            assert by_shards[tag] == by_scatter[tag], tag
            assert sum(by_shards[tag]) > 0, tag
