"""Under `keras.distribution.ModelParallel` on 8 CPU devices, kgrad logs what one device logs on the same
global batch, and the guard reports what it reports on one device (issue 52).

The token model of tests/scripts/model_parallel_values_jax.py (run in its own
process: the number of host devices is fixed when JAX starts), its kernels
split on both axes of a ``(2, 4)`` mesh, the embedding, the vocabulary and
the attention heads on ``model``: ``statistics="all"``, histograms and the
optimizer, logits and attention instruments on every step, with Keras' own
``train_step`` and with a model's own (``kgrad.value_and_grad``); and a
`kgrad.ProbingModel` whose hidden activations pass through `kgrad.tap`.
"""

import numpy as np
import pytest
from device_scripts import run_script


@pytest.fixture(scope="module")
def runs():
    return run_script("model_parallel_values_jax.py")[0]  # ~2 min on a loaded machine


def rounding_noise(runs):
    """Weights whose gradient is rounding noise: Keras' own sharded gradients (no kgrad) differ from one's.

    The witness of a statistic that differs between one device and the mesh:
    ``attention/key/bias``, whose true gradient is 0 (a softmax does not
    change when a constant is added to every score), so that what remains is
    float32 rounding, different for each order of the sums (~1e-13 here).
    """
    one, sharded = runs["gradients"]["one_device"], runs["gradients"]["sharded"]
    noisy = set()
    for path in one:
        expected, got = np.array(one[path]), np.array(sharded[path])
        if np.abs(got - expected).max() > 1e-3 * np.abs(expected).max():
            noisy.add(path)
    return noisy


def test_keras_own_sharded_gradients_are_one_devices_but_for_rounding_noise(runs):
    one, sharded = runs["gradients"]["one_device"], runs["gradients"]["sharded"]
    assert one.keys() == sharded.keys()
    noisy = rounding_noise(runs)
    # The witness is a witness: only the gradient that is 0 in exact arithmetic differs.
    assert noisy == {"attention/key/bias"}
    largest = max(np.abs(np.array(gradient)).max() for gradient in one.values())
    for path in noisy:
        assert np.abs(np.array(one[path])).max() < 1e-6 * largest, path
    for path in set(one) - noisy:
        np.testing.assert_allclose(sharded[path], one[path], rtol=1e-4, atol=1e-7, err_msg=path)


def weight_path(tag):
    return tag.split("/", 1)[1]


@pytest.mark.parametrize("kind", ["keras_step", "own_step"])
def test_model_parallel_logs_the_values_of_one_device(runs, kind):
    assert runs["devices"] == 8
    one_device, sharded = runs[kind]["one_device"], runs[kind]["sharded"]
    noisy = rounding_noise(runs)
    assert [r["step"] for r in sharded] == [r["step"] for r in one_device] == [0, 1]
    for one, split in zip(one_device, sharded):
        assert split["scalars"].keys() == one["scalars"].keys()
        # Every kind of statistic is there: a both-axes kernel, the embedding, the instruments.
        assert {"weight_grad_norm/up/kernel", "weight_grad_zero_fraction/embedding/embeddings",
                "adam_rms/down/kernel", "logit_lse_mean/output", "attention_entropy/attention/head_3",
                "update_ratio/up/kernel"} <= split["scalars"].keys()
        assert split["histograms"].keys() == one["histograms"].keys() and one["histograms"]
        explained = []
        for tag, value in one["scalars"].items():
            if weight_path(tag) in noisy:  # see rounding_noise
                explained.append(tag)
                continue
            if "zero_fraction" in tag or "nonfinite" in tag:
                assert split["scalars"][tag] == value, tag
            else:
                assert split["scalars"][tag] == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), tag
        assert len(explained) < 20, explained  # the noise's tags only
        for tag, buckets in one["histograms"].items():
            expected, got = np.array(buckets), np.array(split["histograms"][tag])
            np.testing.assert_allclose(got[:, :2], expected[:, :2], rtol=1e-6, err_msg=tag)
            assert got[:, 2].sum() == expected[:, 2].sum(), tag
            if weight_path(tag) in noisy:
                continue
            # The edges are fixed: a value moves bucket only where the sharded sums rounded
            # it across an edge; the counts up to each edge agree within 1.
            assert np.abs(np.cumsum(got[:, 2]) - np.cumsum(expected[:, 2])).max() <= 1, tag


def test_the_guard_trips_and_names_the_same_tensor_as_on_one_device(runs):
    one, sharded = runs["guard"]["one_device"], runs["guard"]["sharded"]
    assert "model" in sharded["sharding"] and "batch" in sharded["sharding"]
    assert sharded["step"] == one["step"] == 1
    for key in ("tensor", "born_in", "born_at", "last_finite_step"):
        assert sharded[key] == one[key], key
    assert sharded["last_finite_norm"] == pytest.approx(one["last_finite_norm"], rel=1e-5)
    for got, expected in zip(sharded["weights"], one["weights"]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_probing_model_and_its_tap_give_the_values_of_one_device(runs):
    one_device, sharded = runs["probing_model"]["one_device"], runs["probing_model"]["sharded"]
    assert [r["step"] for r in sharded] == [r["step"] for r in one_device] == [0, 1]
    for one, split in zip(one_device, sharded):
        assert split["scalars"].keys() == one["scalars"].keys()
        # The tapped tensor (split on the batch) and dJ/d(it), and the both-axes kernels.
        assert {"activation_mean/hidden", "grad_norm/hidden", "weight_grad_norm/up/kernel",
                "weight_grad_norm/down/kernel"} <= split["scalars"].keys()
        for tag, value in one["scalars"].items():
            if "zero_fraction" in tag or "nonfinite" in tag:
                assert split["scalars"][tag] == value, tag
            else:
                assert split["scalars"][tag] == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), tag
        assert split["histograms"].keys() == one["histograms"].keys() and one["histograms"]
        for tag, buckets in one["histograms"].items():
            expected, got = np.array(buckets), np.array(split["histograms"][tag])
            np.testing.assert_allclose(got[:, :2], expected[:, :2], rtol=1e-6, err_msg=tag)
            assert np.abs(np.cumsum(got[:, 2]) - np.cumsum(expected[:, 2])).max() <= 1, tag
