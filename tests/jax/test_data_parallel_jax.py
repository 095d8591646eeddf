"""`keras.distribution.DataParallel` over 2 CPU devices logs what one device logs on the same global batch,
and the guard reports what it reports on one device: with Keras' own train_step, and with a model's own
(``kgrad.value_and_grad``)."""

import numpy as np
import pytest
from device_scripts import run_script


@pytest.fixture(scope="module")
def runs():
    return run_script("data_parallel_jax.py")[0]  # 63 s on an idle machine


@pytest.fixture(params=["keras_step", "own_step"])
def kind(request, runs):
    """``(name, the runs of that kind of train_step)``."""
    return request.param, runs if request.param == "keras_step" else runs["own_step"]


def test_the_batch_is_split_over_two_devices(runs, kind):
    assert runs["devices"] == 2
    assert "batch" in kind[1]["sharding"]  # the variables live on the DataParallel mesh


def test_data_parallel_logs_the_values_of_one_device(kind):
    name, runs = kind
    one, parallel = runs["one_device"], runs["data_parallel"]
    assert [r["step"] for r in parallel] == [r["step"] for r in one] == [0, 2, 4, 6]
    for single, split in zip(one, parallel):
        assert split["scalars"].keys() == single["scalars"].keys()
        assert "grad_norm/sin" in split["scalars"] and "weight_grad_norm/out/kernel" in split["scalars"]
        # The instruments too: per-example norms over the global batch, Adam's moments.
        assert split["scalars"]["global/batch_size"] == 8.0
        assert {"example_grad_norm_max/hidden/kernel", "adam_rms/out/kernel"} <= split["scalars"].keys()
        # An own train_step's kgrad.value_and_grad watches no input, as a ProbeTape.
        assert ("input_grad_norm/input" in split["scalars"]) == (name == "keras_step")
        for tag, value in single["scalars"].items():
            # Sums over the batch in another order: float32 rounding only.
            assert split["scalars"][tag] == pytest.approx(value, rel=1e-5, abs=1e-7), tag
        for tag, buckets in single["histograms"].items():
            expected, got = np.array(buckets), np.array(split["histograms"][tag])
            np.testing.assert_allclose(got[:, :2], expected[:, :2], rtol=1e-5, atol=1e-6, err_msg=tag)
            assert got[:, 2].sum() == expected[:, 2].sum(), tag
            # A value on a bucket edge may fall on either side of it after a
            # reduction in another order: the counts up to each edge agree within 1.
            assert np.abs(np.cumsum(got[:, 2]) - np.cumsum(expected[:, 2])).max() <= 1, tag


def test_the_exact_statistics_of_a_step_holding_nan_are_those_of_one_device(runs):
    # The NaN sends the probed step's statistics down the exact path (one host call): it sees
    # the whole global batch, not one device's half.
    one = {r["step"]: r for r in runs["nan_one_device"]}[2]["scalars"]
    split = {r["step"]: r for r in runs["nan_data_parallel"]}[2]["scalars"]
    assert one["grad_nonfinite/hidden"] == split["grad_nonfinite/hidden"] == 8.0
    assert split.keys() == one.keys()
    for tag, value in one.items():
        if np.isnan(value):
            assert np.isnan(split[tag]), tag
        else:
            assert split[tag] == pytest.approx(value, rel=1e-5, abs=1e-7), tag


def test_probing_does_not_change_data_parallel_training(kind):
    assert kind[1]["weight_difference"] == 0.0


def test_guarding_does_not_change_data_parallel_training(kind):
    assert kind[1]["guarded_weight_difference"] == 0.0


@pytest.mark.parametrize("run", ["guard_data_parallel", "guard_and_probe_data_parallel"])
def test_the_guard_under_data_parallel_reports_what_it_reports_on_one_device(kind, run):
    one, parallel = kind[1]["guard_one_device"], kind[1][run]
    # The NaN is in the third batch's inputs: the loss of step 2, born in the data.
    assert (one["step"], one["batch_index"], one["born_in"]) == (2, 2, "data")
    assert one["tensor"].startswith("loss/"), one["tensor"]
    for key in ("step", "tensor", "born_in", "born_at", "born_type", "last_finite_step", "batch_index"):
        assert parallel[key] == one[key], key
    assert parallel["last_finite_norm"] == pytest.approx(one["last_finite_norm"], rel=1e-5)
    # The weights of the last finite step, as on one device.
    for got, want in zip(parallel["weights"], one["weights"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
