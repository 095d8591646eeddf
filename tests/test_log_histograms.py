"""Log-magnitude histograms on TensorFlow: exact counts against NumPy, the option, a real fit read back."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from histogram_reference import hard_values, log_magnitude_counts

import kgrad
from kgrad.backends.tensorflow.summarize import stats
from kgrad.plan.histogram_buckets import (
    LOG_BUCKET_COUNT,
    MAGNITUDE_EDGES,
    is_log_magnitude,
    log_magnitude_edges,
    resolve_bucket_count,
)
from kgrad.plan.options import ProbeConfig

RUNS = {
    "eager": lambda fn: fn,
    "graph": tf.function,
    "xla": lambda fn: tf.function(fn, jit_compile=True),
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_each_element_is_in_the_bucket_its_value_belongs_to(run):
    values = hard_values()
    tiny = np.array([3.0, -2e-7, 0.0], np.float32)  # a second tensor in the same call
    summarize = RUNS[run](lambda *tensors: stats.summarize_many(list(tensors), LOG_BUCKET_COUNT))
    moments, histograms = summarize(tf.constant(values), tf.constant(tiny))
    histograms = histograms.numpy()
    for histogram, tensor in zip(histograms, (values, tiny)):  # noqa: B905
        np.testing.assert_array_equal(histogram[:, 2], log_magnitude_counts(tensor))
        np.testing.assert_array_equal(np.append(histogram[:, 0], histogram[-1, 1]), log_magnitude_edges())
    # NaN and ±Inf are in no bucket; the non-finite count has them, as for linear histograms.
    assert histograms[0, :, 2].sum() == np.isfinite(values).sum()
    assert moments.numpy()[0, 6] == (~np.isfinite(values)).sum()


def test_the_edges_are_sign_times_half_decades_with_a_zero_bucket():
    edges = log_magnitude_edges()
    assert len(edges) == int(LOG_BUCKET_COUNT) + 1 == 66
    assert edges[0] == np.float32(-1e4) and edges[-1] == np.float32(1e4)
    middle = int(LOG_BUCKET_COUNT) // 2
    assert (edges[middle], edges[middle + 1]) == (np.float32(-1e-12), np.float32(1e-12))
    np.testing.assert_allclose(MAGNITUDE_EDGES[1:] / MAGNITUDE_EDGES[:-1], np.sqrt(10.0), rtol=1e-6)
    assert is_log_magnitude(edges) and not is_log_magnitude(np.linspace(-1, 1, 66))


def test_values_beyond_the_range_go_to_the_outermost_bucket_of_their_side():
    _, histogram = stats.summarize(tf.constant([1e9, -1e9, 1e-20, -1e-20, 0.0]), LOG_BUCKET_COUNT)
    counts = histogram.numpy()[:, 2]
    middle = int(LOG_BUCKET_COUNT) // 2
    expected = np.zeros(int(LOG_BUCKET_COUNT))
    expected[[0, -1, middle - 1, middle + 1, middle]] = 1
    np.testing.assert_array_equal(counts, expected)


def test_counts_of_shards_add_up_to_the_counts_of_the_whole_tensor():
    values = hard_values(seed=1)
    shards = np.array_split(values, 3)
    _, whole = stats.summarize_many([tf.constant(values)], LOG_BUCKET_COUNT)
    _, parts = stats.summarize_many([tf.constant(shard) for shard in shards], LOG_BUCKET_COUNT)
    np.testing.assert_array_equal(parts.numpy()[:, :, 2].sum(axis=0), whole.numpy()[0, :, 2])
    np.testing.assert_array_equal(parts.numpy()[0, :, :2], whole.numpy()[0, :, :2])  # the same edges


def test_histogram_buckets_option_and_its_errors():
    assert ProbeConfig().bucket_count == LOG_BUCKET_COUNT
    assert ProbeConfig(histogram_buckets="linear").bucket_count == 30
    # Code written before the log kind, passing a bucket count, keeps linear histograms.
    assert ProbeConfig(bucket_count=12).bucket_count == 12
    assert ProbeConfig(bucket_count=12).bucket_count != LOG_BUCKET_COUNT
    assert resolve_bucket_count("linear", None) == 30
    expected = (
        r"`histogram_buckets` must be one of \['log', 'linear'\]. "
        r"Received: histogram_buckets='logarithmic'"
    )
    with pytest.raises(ValueError, match=expected):
        kgrad.GradientProbe(histogram_buckets="logarithmic")
    expected = "`bucket_count` applies to histogram_buckets='linear' only.*bucket_count=12"
    with pytest.raises(ValueError, match=expected):
        kgrad.GradientProbe(histogram_buckets="log", bucket_count=12)
    with pytest.raises(ValueError, match="`bucket_count` must be a positive int"):
        kgrad.GradientProbe(histogram_buckets="linear", bucket_count=0)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_fit_writes_log_magnitude_histograms_that_read_back_exactly(tmp_path, jit_compile):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="relu", name="hidden"),
        keras.layers.Dense(1, name="out"),
    ])
    model.compile("sgd", "mse", jit_compile=jit_compile)
    x, y = np.random.default_rng(0).normal(size=(8, 4)).astype("float32"), np.ones((8, 1), "float32")
    # The first step's references, another way: a forward pass and a plain GradientTape.
    hidden = keras.Model(model.inputs[0], model.get_layer("hidden").output)(x).numpy()
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, model(x))
    kernel_gradient = tape.gradient(loss, model.get_layer("hidden").kernel).numpy()
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, statistics="all")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[probe])
    histograms = kgrad.read_logs(tmp_path)["kgrad"]["histograms"]
    references = {"activation_hist/hidden": hidden, "weight_grad_hist/hidden/kernel": kernel_gradient}
    for tag, reference in references.items():
        written = histograms[tag].values[0]
        np.testing.assert_array_equal(np.append(written[:, 0], written[-1, 1]), log_magnitude_edges())
        np.testing.assert_array_equal(written[:, 2], log_magnitude_counts(reference), err_msg=tag)
