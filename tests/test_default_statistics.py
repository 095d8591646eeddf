"""What a probe writes by default, and ``statistics="all"``: tags read back from event files."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from kgrad import demo
from kgrad.logs import layout
from kgrad.backends.tensorflow.summarize import norms
from kgrad.dashboard import events
from kgrad.plan.options import ProbeConfig
from kgrad.backends.tensorflow.summarize.summaries import SummaryBuilder
from kgrad.plan.tag_selection import weight_tags_written

STATS = ("norm", "mean", "std", "min", "max", "zero_fraction", "nonfinite")
# The demo's MLP: 8 hidden Dense layers and an output, a kernel and a bias each.
LAYERS = [f"hidden_{index}" for index in range(1, 9)] + ["output"]
KERNELS = [f"{layer}/kernel" for layer in LAYERS]
WEIGHTS = KERNELS + [f"{layer}/bias" for layer in LAYERS]
# Spelled out on purpose: the default is the users' TensorBoard layout.
DEFAULT_SCALARS = (
    {f"grad_norm/{layer}" for layer in LAYERS}
    | {f"grad_nonfinite/{layer}" for layer in LAYERS}
    | {f"activation_zero_fraction/{layer}" for layer in LAYERS}
    | {
        f"{kind}/{kernel}"
        for kind in ("weight_grad_norm", "weight_norm", "update_ratio")
        for kernel in KERNELS
    }
    | {"input_grad_norm/input", "pred_grad_norm/output", "global/grad_norm", "global/loss"}
)
DEFAULT_HISTOGRAMS = (
    {f"grad_hist/{layer}" for layer in LAYERS}
    | {f"weight_grad_hist/{kernel}" for kernel in KERNELS}
    | {"input_grad_hist/input", "pred_grad_hist/output"}
)
TENSORS = (
    [("activation", layer) for layer in LAYERS]
    + [("grad", layer) for layer in LAYERS]
    + [("pred_grad", "output"), ("input_grad", "input")]
    + [("weight_grad", weight) for weight in WEIGHTS]
)
ALL_SCALARS = (
    {f"{kind}_{stat}/{name}" for kind, name in TENSORS for stat in STATS}
    | {"pred_grad_example_norm_mean/output", "pred_grad_example_norm_max/output"}
    | {f"{kind}/{weight}" for kind in ("weight_norm", "update_ratio") for weight in WEIGHTS}
    | {"global/grad_norm", "global/loss"}
)
ALL_HISTOGRAMS = {f"{kind}_hist/{name}" for kind, name in TENSORS}


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """The demo's sigmoid MLP, one epoch of 8 steps probed every 4, per setting."""
    x, y = demo.make_circle_data(256)
    runs = {}
    for statistics in ("default", "all"):
        keras.utils.set_random_seed(1)
        log_dir = tmp_path_factory.mktemp(statistics)
        probe = kgrad.GradientProbe(log_dir, every_n_steps=4, statistics=statistics)
        model = demo.build_mlp("sigmoid", "glorot_uniform")
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[probe])
        runs[statistics] = {"logs": kgrad.read_logs(log_dir), "probe": probe}
    return runs


def test_default_writes_what_people_look_at_on_the_demo_mlp(demo_runs):
    logs = demo_runs["default"]["logs"]
    assert set(logs) == {"kgrad"}
    assert set(logs["kgrad"]["scalars"]) == DEFAULT_SCALARS
    assert len(DEFAULT_SCALARS) == 58 <= 60
    assert set(logs["kgrad"]["histograms"]) == DEFAULT_HISTOGRAMS
    assert logs["kgrad"]["scalars"]["grad_norm/hidden_1"].steps.tolist() == [0, 4]


def test_all_writes_every_moment_of_every_tensor(demo_runs):
    logs = demo_runs["all"]["logs"]["kgrad"]
    assert set(logs["scalars"]) == ALL_SCALARS
    assert (len(ALL_SCALARS), len(ALL_HISTOGRAMS)) == (306, 38)
    assert set(logs["histograms"]) == ALL_HISTOGRAMS


def test_the_tags_written_by_default_have_the_same_values(demo_runs):
    default, every = (demo_runs[key]["logs"]["kgrad"] for key in ("default", "all"))
    for kind in ("scalars", "histograms"):
        for tag, series in default[kind].items():
            np.testing.assert_array_equal(series.steps, every[kind][tag].steps, err_msg=tag)
            np.testing.assert_array_equal(series.values, every[kind][tag].values, err_msg=tag)
    # The record handed to on_probe / probe.latest holds what was written.
    assert set(demo_runs["default"]["probe"].latest.scalars) == DEFAULT_SCALARS


def test_report_reads_the_default_set(demo_runs):
    (health,) = kgrad.health_report(demo_runs["default"]["logs"])
    assert health.gradient == "dJ/dw"
    assert [layer.layer for layer in health.layers] == LAYERS
    for layer in health.layers:
        assert np.isfinite([layer.grad_norm, layer.zero_fraction, layer.update_ratio]).all(), layer
        assert layer.nonfinite == 0


@pytest.mark.parametrize("value", ["full", None, "ALL", ["all"]])
def test_statistics_must_be_default_or_all(value):
    message = re.escape(
        f"`statistics` must be one of ['default', 'all']. Received: statistics={value!r}."
    )
    with pytest.raises(ValueError, match=message):
        kgrad.GradientProbe(statistics=value)
    with pytest.raises(ValueError, match=message):
        ProbeConfig(statistics=value)
    inputs = keras.Input((2,))
    model = kgrad.ProbingModel(inputs, keras.layers.Dense(1)(inputs))
    with pytest.raises(ValueError, match=message):
        model.configure_probe(statistics=value)


def test_probing_model_takes_the_option():
    inputs = keras.Input((2,))
    model = kgrad.ProbingModel(inputs, keras.layers.Dense(1, name="out")(inputs))
    model.configure_probe(every_n_steps=1, statistics="all")
    assert model.probe_config.statistics == "all"


def _builder(statistics, histograms=True):
    builder = SummaryBuilder(histograms, 5, statistics=statistics)
    rng = np.random.default_rng(0)
    tensors = [
        ("activation", "a", (4, 3)),
        ("weight_grad", "d/kernel", (3, 3)),
        ("weight_grad", "d/bias", (3,)),
        ("grad", "a", (4, 3)),
        ("example_grad_norm", "d/kernel", (4,)),  # another kind: written whole
    ]
    indices = [
        builder.add_tensor(kind, name, tf.constant(rng.normal(size=shape), tf.float32))
        for kind, name, shape in tensors
    ]
    builder.add_scalars(["weight_norm/d/kernel", "weight_norm/d/bias"], tf.constant([1.0, 2.0]))
    builder.add_scalar("pred_grad_example_norm_max/output", tf.constant(3.0))
    builder.add_scalar(
        "global/grad_norm", lambda moments, _: moments[indices[1], 0] + moments[indices[2], 0]
    )
    return builder


def test_builder_drops_rows_before_the_buffer_and_keeps_values():
    default, every = _builder("default"), _builder("all")
    assert default.scalar_names == [
        "activation_zero_fraction/a",
        "weight_grad_norm/d/kernel",
        "grad_norm/a",
        "grad_nonfinite/a",
        *[f"example_grad_norm_{stat}/d/kernel" for stat in ("mean", "max")],
        "weight_norm/d/kernel",
        "weight_norm/d/bias",
        "global/grad_norm",
    ]
    assert default.histogram_names == [
        "weight_grad_hist/d/kernel",
        "grad_hist/a",
        "example_grad_norm_hist/d/kernel",
    ]
    assert len(every.scalar_names) == 5 * 7 + 4 and len(every.histogram_names) == 5
    all_scalars = dict(zip(every.scalar_names, every.scalars().numpy()))
    all_histograms = dict(zip(every.histogram_names, every.histograms().numpy()))
    assert dict(zip(default.scalar_names, default.scalars().numpy())) == {
        tag: all_scalars[tag] for tag in default.scalar_names
    }
    for tag, histogram in zip(default.histogram_names, default.histograms().numpy()):
        np.testing.assert_array_equal(histogram, all_histograms[tag], err_msg=tag)
    later = default.with_inputs(default.inputs())
    assert (
        later.scalar_names == default.scalar_names
        and later.histogram_names == default.histogram_names
    )
    np.testing.assert_array_equal(later.scalars(), default.scalars())


def test_builder_without_histograms_and_the_keyword_default():
    builder = _builder("default", histograms=False)
    assert builder.histogram_names == [] and builder.histograms().shape == (0, 5, 3)
    assert len(builder.scalars()) == len(builder.scalar_names)
    # What a builder made without the keyword writes: everything.
    assert SummaryBuilder(True, 5)._statistics == "all"


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), 1e30])
def test_a_tensor_of_which_only_the_norm_is_written_gets_one_kernel_and_the_same_norm(bad):
    # A kernel's gradient without its histogram, and a bias's, which only
    # enters the global norm: the norm of every element, as under "all".
    rng = np.random.default_rng(1)
    kernel = rng.normal(size=(3, 3)).astype(np.float32)
    if bad is not None:
        kernel[1, 2] = bad  # 1e30: squares beyond float32, the rescaled branch
    bias = rng.normal(size=(3,)).astype(np.float32)

    def builder_for(statistics):
        builder = SummaryBuilder(False, 5, statistics=statistics)
        indices = [
            builder.add_tensor("weight_grad", "d/kernel", tf.constant(kernel)),
            builder.add_tensor("weight_grad", "d/bias", tf.constant(bias)),
        ]
        builder.add_scalar(
            "global/grad_norm",
            lambda moments, _: norms.combined_norm(tf.gather(moments[:, 0], indices)),
        )
        return builder

    default = builder_for("default")
    written = dict(zip(default.scalar_names, default.scalars().numpy().tolist()))
    every = builder_for("all")
    reference = dict(zip(every.scalar_names, every.scalars().numpy().tolist()))
    assert list(written) == ["weight_grad_norm/d/kernel", "global/grad_norm"]
    in_float64 = np.linalg.norm(np.float64(kernel))
    expected_global = np.sqrt(in_float64**2 + np.sum(np.float64(bias) ** 2))
    np.testing.assert_allclose(
        [written["weight_grad_norm/d/kernel"], written["global/grad_norm"]],
        [in_float64, expected_global], rtol=1e-6,
    )
    for tag, value in written.items():
        np.testing.assert_allclose(value, reference[tag], rtol=1e-6, err_msg=tag)
    # One kernel per tensor: none of the other moments' reductions is traced.
    graph = tf.function(lambda: builder_for("default").scalars()).get_concrete_function().graph
    op_types = {op.type for op in graph.get_operations()}
    assert op_types.isdisjoint({"Sign", "Min"}), sorted(op_types)


def test_weight_tags_are_written_of_the_weights_whose_gradient_norm_is():
    kernel, bias = tf.zeros([3, 2]), tf.zeros([2])
    assert weight_tags_written("default", kernel) and not weight_tags_written("default", bias)
    assert not weight_tags_written("default", None)
    assert all(weight_tags_written("all", gradient) for gradient in (kernel, bias, None))


def test_a_normalization_layer_gets_the_dj_dw_of_its_gamma_and_beta_by_default(tmp_path):
    # Its weights are 1-D, as biases are, but they are all the dJ/dw it has: without
    # them its row in the report and the tab was empty ("not logged") in every view
    # but dJ/d(activation). Reference: a manual tape from the same weights on the same
    # batch, and the weights before and after the step.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.Conv2D(3, 3, name="conv"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.Flatten(),
        keras.layers.Dense(4, name="dense"),
        keras.layers.LayerNormalization(beta_initializer="ones", name="ln"),
        keras.layers.Dense(1, name="out"),
    ])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.random.default_rng(0).normal(size=(8, 6, 6, 2)).astype("float32")
    y = np.ones((8, 1), "float32")
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x, y, model(x, training=True))
    weights = {weight.path.split("/", 1)[1]: weight for weight in model.trainable_weights}
    gradients = dict(zip(weights, tape.gradient(loss, list(weights.values()))))
    before = {path: weight.numpy() for path, weight in weights.items()}
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[probe])
    scalars, histograms = probe.latest.scalars, probe.latest.histograms
    for path in ("bn/gamma", "bn/beta", "ln/gamma", "ln/beta"):
        change = np.linalg.norm(weights[path].numpy() - before[path])
        np.testing.assert_allclose(
            scalars[f"weight_grad_norm/{path}"], np.linalg.norm(gradients[path]), rtol=1e-4
        )
        np.testing.assert_allclose(scalars[f"weight_norm/{path}"], np.linalg.norm(before[path]), rtol=1e-5)
        norm = np.linalg.norm(before[path])  # beta starts at 0: logged as 1, all of its change
        np.testing.assert_allclose(scalars[f"update_ratio/{path}"], change / norm if norm else 1.0, rtol=1e-4)
        assert f"weight_grad_hist/{path}" not in histograms  # the norm only, as for a bias
    # A bias beside a kernel still writes nothing of its own.
    assert not [tag for tag in scalars if tag.endswith(("dense/bias", "out/bias", "conv/bias"))]
    (run,) = kgrad.health_report(kgrad.read_logs(tmp_path))
    rows = {layer.layer: layer for layer in run.layers}
    assert list(rows) == ["conv", "bn", "dense", "ln", "out"]
    expected = np.sqrt(np.sum(np.square(gradients["bn/gamma"])) + np.sum(np.square(gradients["bn/beta"])))
    assert rows["bn"].grad_norm == pytest.approx(expected, rel=1e-4)
    changes = [np.sum(np.square(weights[p].numpy() - before[p])) for p in ("ln/gamma", "ln/beta")]
    norms = [np.sum(np.square(before[p])) for p in ("ln/gamma", "ln/beta")]
    assert rows["ln"].update_ratio == pytest.approx(np.sqrt(sum(changes) / sum(norms)), rel=1e-4)
    # The logs hold every weight's shape, as both readers return it: bn and ln, all
    # vectors, are set beside each other, not beside the kernels.
    shapes = {path: tuple(weight.shape) for path, weight in weights.items()}
    assert kgrad.read_logs(tmp_path)["kgrad"]["weight_shapes"] == shapes
    assert events.LogCache(str(tmp_path)).runs()["kgrad"]["weight_shapes"] == shapes
    assert run.vector_only_layers == ("bn", "ln")
    vector_largest = max(rows["bn"].grad_norm, rows["ln"].grad_norm)
    matrix_largest = max(rows[name].grad_norm for name in ("conv", "dense", "out"))
    for name in rows:
        largest = vector_largest if name in ("bn", "ln") else matrix_largest
        assert rows[name].ratio_to_max == pytest.approx(rows[name].grad_norm / largest)


def test_weight_tags_of_a_1d_weight_are_written_when_its_layer_has_no_matrix():
    scale = tf.zeros([3])
    assert weight_tags_written("default", scale, layer_has_a_matrix=False)
    assert not weight_tags_written("default", scale, layer_has_a_matrix=True)
    assert not weight_tags_written("default", None, layer_has_a_matrix=False)


def test_layout_has_at_most_eight_exact_tags_per_chart(demo_runs):
    tags = list(demo_runs["all"]["probe"].latest.scalars)
    charts_layout = layout.custom_scalar_layout(tags)
    assert "the kgrad tab" in charts_layout.category[0].title
    shown = {}
    for category in charts_layout.category:
        for chart in category.chart:
            (regex,) = chart.multiline.tag
            matching = [tag for tag in tags if re.match(regex, tag)]
            shown[chart.title] = matching
            assert matching and (
                len(matching) <= layout.LAYERS_PER_CHART or "all weights" in chart.title
            )
    assert shown["dJ/d(activation) norm: hidden_1 … hidden_5"] == [
        f"grad_norm/{layer}" for layer in LAYERS[:5]
    ]
    assert shown["dJ/d(activation) norm: hidden_6 … output"] == [
        f"grad_norm/{layer}" for layer in LAYERS[5:]
    ]
    assert shown["‖dJ/dw‖ of all weights, dJ/dŷ and dJ/dx norms"] == [
        "pred_grad_norm/output",
        "input_grad_norm/input",
        "global/grad_norm",
    ]
    nonfinite = [tag for tag in tags if "_nonfinite/" in tag]
    assert sorted(
        tag for title, found in shown.items() if title.startswith("NaN/Inf") for tag in found
    ) == sorted(nonfinite)
