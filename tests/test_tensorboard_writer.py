"""What `GradientProbe` writes to TensorBoard, read back from the event files."""

import os
import re

import keras
import numpy as np
import pytest

import tensorflow as tf
from tensorboard.plugins.custom_scalar import layout_pb2

import kgrad
from kgrad.logs import layout, writer as tensorboard
from kgrad.plan.tag_names import describe_tag

# The tag scheme, spelled out here on purpose: it is the users' TensorBoard
# layout, so a change must show up as a failing test.
STATS = ("norm", "mean", "std", "min", "max", "zero_fraction", "nonfinite")
WEIGHTS = ("hidden/kernel", "hidden/bias", "out/kernel", "out/bias")
TENSORS = (
    [("activation", layer) for layer in ("hidden", "out")]
    + [("grad", layer) for layer in ("hidden", "out")]
    + [("pred_grad", "output"), ("input_grad", "input")]
    + [("weight_grad", weight) for weight in WEIGHTS]
)
EXPECTED_SCALARS = (
    {f"{kind}_{stat}/{name}" for kind, name in TENSORS for stat in STATS}
    | {"pred_grad_example_norm_mean/output", "pred_grad_example_norm_max/output"}
    | {f"weight_norm/{weight}" for weight in WEIGHTS}
    | {f"update_ratio/{weight}" for weight in WEIGHTS}
    | {"global/grad_norm", "global/loss"}
)
EXPECTED_HISTOGRAMS = {f"{kind}_hist/{name}" for kind, name in TENSORS}
# What a default probe writes (statistics="default"): norms, update ratios
# and gradient histograms of kernels, dJ/d(activation) non-finite counts.
KERNELS = ("hidden/kernel", "out/kernel")
EXPECTED_DEFAULT_SCALARS = (
    {f"{kind}/{layer}" for kind in ("grad_norm", "grad_nonfinite", "activation_zero_fraction")
     for layer in ("hidden", "out")}
    | {f"{kind}/{path}" for kind in ("weight_grad_norm", "weight_norm", "update_ratio") for path in KERNELS}
    | {"pred_grad_norm/output", "input_grad_norm/input", "global/grad_norm", "global/loss"}
)
EXPECTED_DEFAULT_HISTOGRAMS = (
    {"grad_hist/hidden", "grad_hist/out", "pred_grad_hist/output", "input_grad_hist/input"}
    | {f"weight_grad_hist/{kernel}" for kernel in KERNELS}
)
# Elements of each histogrammed tensor for one batch of 4: hidden is 3 -> 2.
ELEMENTS = {
    "activation_hist/hidden": 4 * 2,
    "grad_hist/hidden": 4 * 2,
    "activation_hist/out": 4 * 1,
    "grad_hist/out": 4 * 1,
    "pred_grad_hist/output": 4 * 1,
    "input_grad_hist/input": 4 * 3,
    "weight_grad_hist/hidden/kernel": 3 * 2,
    "weight_grad_hist/hidden/bias": 2,
    "weight_grad_hist/out/kernel": 2 * 1,
    "weight_grad_hist/out/bias": 1,
}


def tiny_model():
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(2, activation="relu", name="hidden"),
            keras.layers.Dense(1, name="out"),
        ],
        name="tiny",
    )
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


def tiny_data(samples=8):
    rng = np.random.default_rng(0)
    return rng.normal(size=(samples, 3)).astype("float32"), rng.normal(size=(samples, 1)).astype("float32")


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """One fit: 2 epochs of 2 steps, every step probed, with Keras' TensorBoard."""
    keras.utils.set_random_seed(0)
    log_dir = str(tmp_path_factory.mktemp("logs"))
    model = tiny_model()
    initial_kernel = model.get_layer("hidden").kernel.numpy()
    records = []
    probe = kgrad.GradientProbe(
        log_dir, every_n_steps=1, bucket_count=4, on_probe=records.append, statistics="all"
    )
    x, y = tiny_data()
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        shuffle=False,
        validation_data=(x, y),
        verbose=0,
        callbacks=[keras.callbacks.TensorBoard(log_dir), probe],
    )
    return {
        "log_dir": log_dir,
        "logs": kgrad.read_logs(log_dir),
        "records": records,
        "initial_kernel": initial_kernel,
        "model": model,
        "x": x,
    }


def test_runs_and_tags_are_exactly_the_documented_scheme(logged):
    logs = logged["logs"]
    assert set(logs) == {"kgrad", "train", "validation"}
    pairs = {(run, tag) for run, data in logs.items() for tag in data["scalars"]}
    kgrad_pairs = {pair for pair in pairs if pair[0] == "kgrad"}
    assert kgrad_pairs == {("kgrad", tag) for tag in EXPECTED_SCALARS}
    assert ("train", "epoch_loss") in pairs and ("validation", "epoch_loss") in pairs
    histogram_pairs = {(run, tag) for run, data in logs.items() for tag in data["histograms"]}
    assert histogram_pairs == {("kgrad", tag) for tag in EXPECTED_HISTOGRAMS}


def test_default_probe_writes_the_default_tags_with_the_same_values(logged, tmp_path):
    keras.utils.set_random_seed(0)
    x, y = tiny_data()
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, bucket_count=4)
    tiny_model().fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[probe])
    run = kgrad.read_logs(tmp_path)["kgrad"]
    assert set(run["scalars"]) == EXPECTED_DEFAULT_SCALARS
    assert set(run["histograms"]) == EXPECTED_DEFAULT_HISTOGRAMS
    every = logged["logs"]["kgrad"]
    for kind in ("scalars", "histograms"):
        for tag, series in run[kind].items():
            np.testing.assert_allclose(series.values, every[kind][tag].values, rtol=1e-6, err_msg=tag)


def test_event_file_is_in_its_own_run_folder_beside_keras(logged):
    assert sorted(os.listdir(logged["log_dir"])) == ["kgrad", "train", "validation"]
    files = os.listdir(os.path.join(logged["log_dir"], "kgrad"))
    assert len(files) == 1 and files[0].startswith("events.out.tfevents.")


def test_every_probed_step_is_logged_at_optimizer_iterations(logged):
    for tag, series in logged["logs"]["kgrad"]["scalars"].items():
        assert series.steps.tolist() == [0, 1, 2, 3], tag
    for tag, series in logged["logs"]["kgrad"]["histograms"].items():
        assert series.steps.tolist() == [0, 1, 2, 3], tag
        assert series.values.shape == (4, 4, 3), tag


def test_logged_values_are_the_probe_records(logged):
    scalars = logged["logs"]["kgrad"]["scalars"]
    histograms = logged["logs"]["kgrad"]["histograms"]
    for index, record in enumerate(logged["records"]):
        assert record.step == index
        for tag, value in record.scalars.items():
            np.testing.assert_allclose(scalars[tag].values[index], value, rtol=1e-6, err_msg=tag)
        for tag, buckets in record.histograms.items():
            np.testing.assert_allclose(histograms[tag].values[index], buckets, rtol=1e-6, err_msg=tag)


def test_step_zero_values_match_a_numpy_forward_pass(logged):
    scalars = logged["logs"]["kgrad"]["scalars"]
    kernel = logged["initial_kernel"]
    # The hidden bias starts at zero; the first batch is the first 4 samples.
    hidden = np.maximum(logged["x"][:4] @ kernel, 0.0)
    np.testing.assert_allclose(
        scalars["weight_norm/hidden/kernel"].values[0], np.linalg.norm(kernel), rtol=1e-5
    )
    np.testing.assert_allclose(scalars["activation_norm/hidden"].values[0], np.linalg.norm(hidden), rtol=1e-5)
    np.testing.assert_allclose(scalars["activation_zero_fraction/hidden"].values[0], np.mean(hidden == 0))
    np.testing.assert_allclose(scalars["activation_max/hidden"].values[0], hidden.max(), rtol=1e-5)


def test_histogram_counts_add_up_to_the_elements_and_span_min_to_max(logged):
    scalars = logged["logs"]["kgrad"]["scalars"]
    for tag, series in logged["logs"]["kgrad"]["histograms"].items():
        assert series.values[..., 2].sum(axis=1).tolist() == [ELEMENTS[tag]] * 4, tag
        kind, _, name = tag.partition("_hist/")
        low, high = scalars[f"{kind}_min/{name}"].values, scalars[f"{kind}_max/{name}"].values
        degenerate = low == high  # widened by 0.5 on each side, as TensorBoard does
        np.testing.assert_allclose(series.values[:, 0, 0], np.where(degenerate, low - 0.5, low), rtol=1e-5)
        np.testing.assert_allclose(series.values[:, -1, 1], np.where(degenerate, high + 0.5, high), rtol=1e-5)


def test_no_event_file_until_something_is_written(tmp_path):
    writer = tensorboard.ProbeWriter(tmp_path)
    writer.flush()
    writer.close()
    kgrad.GradientProbe(tmp_path / "unused")
    assert os.listdir(tmp_path) == []


def test_events_are_on_disk_at_the_end_of_each_epoch(tmp_path):
    seen = []

    class ReadAtEpochEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            steps = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]["grad_norm/hidden"].steps
            seen.append(steps.tolist())

    probe = kgrad.GradientProbe(tmp_path, every_n_steps=2)
    x, y = tiny_data(16)
    tiny_model().fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[probe, ReadAtEpochEnd()])
    assert seen == [[0, 2], [0, 2, 4, 6]]


def test_keras_tensorboard_update_freq_does_not_drop_probed_steps(tmp_path):
    # Keras wraps each batch in tf.summary.record_if(step % update_freq == 0).
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=2, histograms=False)
    x, y = tiny_data(16)
    tiny_model().fit(
        x,
        y,
        batch_size=4,
        epochs=1,
        verbose=0,
        callbacks=[keras.callbacks.TensorBoard(tmp_path, update_freq=3), probe],
    )
    logs = kgrad.read_logs(tmp_path)
    assert logs["kgrad"]["scalars"]["grad_norm/hidden"].steps.tolist() == [0, 2]
    assert logs["kgrad"]["histograms"] == {}


@pytest.mark.parametrize("count, charts", [(2, [2]), (8, [8]), (9, [5, 4]), (17, [6, 6, 5])])
def test_layout_charts_hold_at_most_eight_layers_in_logged_order(count, charts):
    layers = [f"hidden_{index}" for index in range(1, count + 1)]
    tags = [f"grad_norm/{layer}" for layer in layers] + ["weight_grad_norm/hidden_1/kernel", "grad_norm/x.y"]
    category = layout.custom_scalar_layout(tags[:-1]).category[0]
    assert category.title.startswith("kgrad: dJ/d(activation) norm (") and "kgrad tab" in category.title
    matched = [[tag for tag in tags if re.match(chart.multiline.tag[0], tag)] for chart in category.chart]
    assert [len(found) for found in matched] == charts
    assert [tag for found in matched for tag in found] == [f"grad_norm/{layer}" for layer in layers]
    assert category.chart[0].title == f"dJ/d(activation) norm: hidden_1 … hidden_{charts[0]}"


def test_layout_is_written_once_from_the_first_record_with_layers(tmp_path):
    writer = tensorboard.ProbeWriter(tmp_path)
    writer.write(kgrad.ProbeRecord(0, {"global/loss_scale": 8.0}, {}))  # a skipped step
    writer.write(kgrad.ProbeRecord(1, {"grad_norm/a": 1.0, "global/loss_scale": 4.0}, {}))
    writer.write(kgrad.ProbeRecord(2, {"grad_norm/a": 2.0, "global/loss_scale": 4.0}, {}))
    writer.close()
    (name,) = os.listdir(tmp_path / "kgrad")
    layouts = [
        value.tensor.string_val[0]
        for event in tf.compat.v1.train.summary_iterator(str(tmp_path / "kgrad" / name))
        for value in event.summary.value
        if value.tag == "custom_scalars__config__"
    ]
    assert len(layouts) == 1
    written = layout_pb2.Layout.FromString(layouts[0])
    assert [chart.title for chart in written.category[0].chart] == ["dJ/d(activation) norm: a"]


@pytest.mark.parametrize(
    "tag, description",
    [
        ("grad_norm/dense", "kgrad: L2 norm of dJ/d(output of layer `dense`)"),
        ("activation_zero_fraction/d", "kgrad: fraction of zeros in the output of layer `d`"),
        ("weight_grad_hist/m/d/kernel", "kgrad: histogram of dJ/dw for weight `m/d/kernel`"),
        ("input_grad_nonfinite/input", "kgrad: count of NaN/Inf in dJ/dx for input `input`"),
        ("global/grad_norm", "kgrad: ‖dJ/dw‖ over all trainable weights"),
        ("global/loss", "kgrad: the loss of the probed step (unscaled, of the global batch)"),
        ("update_ratio/m/d/bias", "kgrad: ‖Δw‖ / ‖w‖ of weight `m/d/bias` in the probed step"),
        (
            "global/loss_scale_skipped",
            "kgrad: 1 if the loss scaler skipped the update (its scaled gradients overflowed), else 0",
        ),
        ("global/other", "kgrad"),
        ("something/else", "kgrad"),
    ],
)
def test_describe_tag(tag, description):
    assert describe_tag(tag) == description


def test_writer_round_trip_across_reopened_event_files(tmp_path):
    first = kgrad.ProbeRecord(3, {"grad_norm/a": 0.5}, {"grad_hist/a": np.array([[0.0, 1.0, 4.0]])})
    second = kgrad.ProbeRecord(5, {"grad_norm/a": 0.25}, {"grad_hist/a": np.array([[1.0, 2.0, 4.0]])})
    writer = tensorboard.ProbeWriter(tmp_path)
    writer.write(first)
    writer.close()
    writer.write(second)
    writer.close()
    run = kgrad.read_logs(tmp_path)["kgrad"]
    assert len(os.listdir(tmp_path / "kgrad")) == 2
    assert run["scalars"]["grad_norm/a"].steps.tolist() == [3, 5]
    assert run["scalars"]["grad_norm/a"].values.tolist() == [0.5, 0.25]
    np.testing.assert_array_equal(run["histograms"]["grad_hist/a"].values, [[[0, 1, 4]], [[1, 2, 4]]])


def test_records_with_changing_tag_sets_keep_their_own_values(tmp_path):
    # A step the loss scaler skipped is written with fewer tags; the records
    # around it must still carry their own values, not a reused Summary's.
    hist = lambda low: np.array([[low, low + 1.0, 2.0]])  # noqa: E731
    records = [
        kgrad.ProbeRecord(0, {"grad_norm/a": 1.0, "global/loss_scale": 8.0}, {"grad_hist/a": hist(0.0)}),
        kgrad.ProbeRecord(1, {"global/loss_scale": 4.0}, {}),
        kgrad.ProbeRecord(2, {"grad_norm/a": 3.0, "global/loss_scale": 4.0}, {"grad_hist/a": hist(5.0)}),
        kgrad.ProbeRecord(3, {"grad_norm/a": 4.0, "global/loss_scale": 2.0}, {"grad_hist/a": hist(7.0)}),
    ]
    writer = tensorboard.ProbeWriter(tmp_path)
    for record in records:
        writer.write(record)
    writer.close()
    run = kgrad.read_logs(tmp_path)["kgrad"]
    assert run["scalars"]["grad_norm/a"].steps.tolist() == [0, 2, 3]
    assert run["scalars"]["grad_norm/a"].values.tolist() == [1.0, 3.0, 4.0]
    assert run["scalars"]["global/loss_scale"].values.tolist() == [8.0, 4.0, 4.0, 2.0]
    np.testing.assert_array_equal(run["histograms"]["grad_hist/a"].values[:, 0, 0], [0.0, 5.0, 7.0])
