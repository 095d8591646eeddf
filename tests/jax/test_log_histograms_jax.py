"""Log-magnitude histograms on JAX: exact counts against NumPy, inside jit, and a real fit read back."""

import jax
import keras
import numpy as np
import pytest
from histogram_reference import hard_values, log_magnitude_counts

import kgrad
from kgrad.backends.jax.summarize import log_histograms, stats
from kgrad.plan.histogram_buckets import LOG_BUCKET_COUNT, log_magnitude_edges


def _edges(histogram):
    histogram = np.asarray(histogram)
    return np.append(histogram[:, 0], histogram[-1, 1])


def test_each_element_is_in_the_bucket_its_value_belongs_to_inside_jit():
    values = hard_values()
    row, histogram = jax.jit(lambda x: stats.summarize(x, LOG_BUCKET_COUNT))(values)
    np.testing.assert_array_equal(np.asarray(histogram)[:, 2], log_magnitude_counts(values))
    np.testing.assert_array_equal(_edges(histogram), log_magnitude_edges())
    # NaN and ±Inf are in no bucket; the non-finite count of the row has them.
    assert float(row[6]) == (~np.isfinite(values)).sum()


@pytest.mark.parametrize("way", ["scatter", "reduction", "shards"])
@pytest.mark.parametrize("shape", [(-1,), (5, -1)], ids=["flat", "2d"])
def test_each_way_of_counting_puts_each_element_in_its_bucket(way, shape, monkeypatch):
    # A tensor below 2**17 elements is scattered; from there one reduction of 65 comparisons counts
    # it, and under a distribution each shard's (here, on one device, the custom partitioning's
    # function itself; its shards: tests/jax/test_sharded_counts_jax.py). Against NumPy, NaN and
    # Inf included.
    monkeypatch.setattr(log_histograms, "on_several_devices", lambda: way == "shards")
    monkeypatch.setattr(log_histograms, "COUNTED_IN_ONE_REDUCTION_FROM", 2**62 if way == "scatter" else 1)
    values = hard_values(seed=3)
    values = values[: values.size - values.size % 5].reshape(shape)
    # A new function: traced anew for each way (jit keeps a function's traces).
    counts = jax.jit(lambda x: log_histograms.log_magnitude_counts(x))(values)
    assert counts.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(counts), log_magnitude_counts(values.ravel()))


def test_a_group_mixes_log_linear_and_no_histograms_behind_one_branch():
    values, plain = hard_values(seed=2), np.array([0.5, -1.0, 2.0], np.float32)
    group = jax.jit(lambda a, b: stats.summarize_group(
        [(a, LOG_BUCKET_COUNT, stats.ALL_COLUMNS), (b, 4, stats.ALL_COLUMNS), (b, None, stats.ALL_COLUMNS)]
    ))
    (row, log), (_, linear), (_, none) = group(values, plain)
    np.testing.assert_array_equal(np.asarray(log)[:, 2], log_magnitude_counts(values))
    np.testing.assert_array_equal(np.asarray(linear)[:, 2], [1, 0, 1, 1])  # [-1, -0.25, 0.5, 1.25, 2]
    assert none is None and float(row[6]) == (~np.isfinite(values)).sum()


def test_counts_of_shards_add_up_to_the_counts_of_the_whole_tensor():
    values = hard_values(seed=1)
    whole = np.asarray(stats.summarize(values, LOG_BUCKET_COUNT)[1])
    parts = [np.asarray(stats.summarize(shard, LOG_BUCKET_COUNT)[1]) for shard in np.array_split(values, 3)]
    np.testing.assert_array_equal(sum(part[:, 2] for part in parts), whole[:, 2])


def test_fit_writes_log_magnitude_histograms_that_read_back_exactly(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="relu", name="hidden"),
        keras.layers.Dense(1, name="out"),
    ])
    model.compile("sgd", "mse")
    x, y = np.random.default_rng(0).normal(size=(8, 4)).astype("float32"), np.ones((8, 1), "float32")
    # The first step's references, another way: a forward pass and jax.grad of the loss.
    hidden = np.asarray(keras.Model(model.inputs[0], model.get_layer("hidden").output)(x))
    kernel = model.get_layer("hidden").kernel

    def loss_of(kernel_value):
        values = [kernel_value if w is kernel else w.value for w in model.trainable_variables]
        prediction, _ = model.stateless_call(values, [v.value for v in model.non_trainable_variables], x)
        return keras.losses.MeanSquaredError()(y, prediction)

    kernel_gradient = np.asarray(jax.grad(loss_of)(kernel.value))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
              callbacks=[kgrad.GradientProbe(tmp_path, every_n_steps=1, statistics="all")])
    histograms = kgrad.read_logs(tmp_path)["kgrad"]["histograms"]
    references = {"activation_hist/hidden": hidden, "weight_grad_hist/hidden/kernel": kernel_gradient}
    for tag, reference in references.items():
        written = histograms[tag].values[0]
        np.testing.assert_array_equal(_edges(written), log_magnitude_edges())
        np.testing.assert_array_equal(written[:, 2], log_magnitude_counts(reference), err_msg=tag)
