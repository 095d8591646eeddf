"""The kgrad tab's stability view, without a browser: its numbers against references.

The adam_rms matrix against NumPy from the per-weight logs (RMS over a layer's
elements with the logged weight shapes, max without them), the attention maxima
against the max over heads, the spikes against `kgrad.report.stability` on
`kgrad.read_logs`' output, and a real ``fit`` with ``instruments=["optimizer",
"logits"]`` read back through the plugin's own route.
"""

import json

import keras
import numpy as np
import pytest
from tensorboard.plugins import base_plugin
from werkzeug.test import Client

import kgrad
from kgrad.dashboard import events, views
from kgrad.dashboard.plugin import KgradPlugin
from kgrad.dashboard.stability_view import decode, stability_view
from kgrad.logs.reading import Series
from kgrad.logs.record import ProbeRecord
from kgrad.logs.writer import ProbeWriter
from kgrad.report.stability import spike_indices, stability_report

STEPS = 60
LAYERS = ("dense_0", "dense_1", "dense_2", "output")
SHAPES = {f"{layer}/kernel": (8, 8) for layer in LAYERS} | {f"{layer}/bias": (8,) for layer in LAYERS}
HEADS = 4
#: Planted spikes: (tag, step, value). The loss spike's leaders are dense_2's and output's.
RMS_SPIKE = ("adam_rms/dense_2/kernel", 44, 8.0)
LOGIT_SPIKE = ("logit_max_max/output", 46, 90.0)
ATTENTION_SPIKE = ("attention_logit_max/block/mha/head_2", 45, 60.0)
LOSS_SPIKE = ("global/loss", 48, 10.0)


def _quiet(step, phase):
    # Smooth, within ±0.01: never above mean + 6σ of its own history.
    return 1.0 + 0.01 * np.sin(0.7 * step + phase)


def stability_scalars(step, spikes=(RMS_SPIKE, LOGIT_SPIKE, ATTENTION_SPIKE, LOSS_SPIKE)):
    """One probed step of a run with every stability signal, spikes planted at known steps."""
    scalars = {"global/loss": 2.0 - 0.01 * step, "global/grad_norm": 1.0 + 0.001 * step}
    for index, layer in enumerate(LAYERS):
        scalars[f"grad_norm/{layer}"] = 10.0**-index
        scalars[f"weight_grad_norm/{layer}/kernel"] = 10.0**-index
        scalars[f"adam_rms/{layer}/kernel"] = 0.1 * (index + 1) * _quiet(step, index)
        scalars[f"adam_rms/{layer}/bias"] = 0.05 * _quiet(step, index + 9)
    scalars["logit_max_max/output"] = 5.0 * _quiet(step, 3)
    for head in range(HEADS):
        scalars[f"attention_logit_max/block/mha/head_{head}"] = (2.0 + head) * _quiet(step, head)
        scalars[f"attention_entropy/block/mha/head_{head}"] = 1.0
    for tag, at, value in spikes:
        if step == at:
            scalars[tag] = value
    return scalars


def write_stability_run(log_dir, shapes=SHAPES, steps=range(STEPS), **options):
    writer = ProbeWriter(log_dir, weight_shapes=(lambda: shapes) if shapes else None)
    for step in steps:
        writer.write(ProbeRecord(step, stability_scalars(step, **options), {}))
    writer.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("stability")
    write_stability_run(log_dir)
    data = events.LogCache(log_dir).runs()["kgrad"]
    return data, kgrad.read_logs(log_dir)["kgrad"]["scalars"]


def test_adam_rms_rows_are_the_rms_over_each_layers_elements(run):
    data, scalars = run
    view = views.RunView("kgrad", data).stability()
    rms = view["rms"]
    assert (rms["aggregate"], rms["layers"], view["steps"]) == ("rms", list(LAYERS), list(range(STEPS)))
    matrix = decode(rms["values"]).reshape(len(LAYERS), STEPS)
    for row, layer in enumerate(LAYERS):
        kernel = scalars[f"adam_rms/{layer}/kernel"].values
        bias = scalars[f"adam_rms/{layer}/bias"].values
        expected = np.sqrt((64 * kernel**2 + 8 * bias**2) / 72)  # 64 kernel and 8 bias elements
        np.testing.assert_allclose(matrix[row], expected, rtol=1e-6)
    finite = matrix[np.isfinite(matrix)]
    assert (rms["min"], rms["max"]) == (pytest.approx(finite.min()), pytest.approx(finite.max()))


def test_without_weight_shapes_a_row_is_the_max_over_its_weights(tmp_path):
    write_stability_run(tmp_path, shapes=None)
    data = events.LogCache(tmp_path).runs()["kgrad"]
    scalars = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    rms = views.RunView("kgrad", data).stability()["rms"]
    assert rms["aggregate"] == "max"
    matrix = decode(rms["values"]).reshape(len(LAYERS), STEPS)
    for row, layer in enumerate(LAYERS):
        kernel, bias = (scalars[f"adam_rms/{layer}/{weight}"].values for weight in ("kernel", "bias"))
        expected = np.maximum(kernel, bias)
        np.testing.assert_allclose(matrix[row], expected, rtol=1e-6)


def test_spikes_are_the_reports_at_the_planted_steps(run):
    data, scalars = run
    view = views.RunView("kgrad", data).stability()
    report = stability_report(scalars)  # the reference: kgrad report's rule on read_logs' output
    expected_rms = sorted(
        [LAYERS.index(spike.tag.split("/")[1]), spike.step, spike.step, spike.tag]
        for tag, found in report.spikes.items() if tag.startswith("adam_rms/") for spike in found
    )
    assert [spike[1:] for spike in view["rms"]["spikes"]] == [spike[1:] for spike in expected_rms]
    assert [(s[0], s[2], s[3]) for s in view["rms"]["spikes"]] == [(2, 44, RMS_SPIKE[0])]
    (logits,) = view["logits"]
    assert (logits["name"], logits["spike_steps"], logits["spikes"]) == ("output", [46], [46])
    (loss,) = view["loss"]
    assert loss["spike_steps"] == [spike.step for spike in report.spikes["global/loss"]] == [48]
    (spike,) = view["loss_spikes"]
    assert (spike["step"], spike["column"], spike["value"]) == (48, 48, 10.0)
    keys = ("layer", "signal", "step", "probes_ahead")
    leaders = [tuple(lead[key] for key in keys) for lead in spike["leaders"]]
    assert leaders == [
        ("dense_2", "adam_rms", 44, 4),
        ("block/mha", "attention logit max", 45, 3),
        ("output", "max logit", 46, 2),
    ]
    assert view["missing"] == [] and view["rule"] == "above mean + 6σ of the previous 128 probes"


def test_attention_line_is_the_max_over_heads_with_its_spikes(run):
    data, scalars = run
    (line,) = views.RunView("kgrad", data).stability()["attention"]
    heads = [scalars[f"attention_logit_max/block/mha/head_{h}"].values for h in range(HEADS)]
    expected = np.max(heads, axis=0)
    assert line["name"] == "block/mha" and len(line["tags"]) == HEADS
    np.testing.assert_allclose(line["values"], expected, rtol=1e-6)
    # The rule applied here to NumPy's max over heads: the same spikes as the view's (the report's).
    assert line["spike_steps"] == [int(s) for s in np.asarray(range(STEPS))[spike_indices(expected)]] == [45]


def test_a_logged_nan_is_a_blow_up_and_a_missing_weight_is_not_logged():
    steps = np.arange(12)
    kernel = np.ones(12)
    kernel[11] = np.nan
    scalars = {
        "adam_rms/dense/kernel": Series(steps, kernel),
        "adam_rms/dense/bias": Series(steps[:10], np.ones(10)),  # steps 10 and 11 not logged
        "logit_max_max/output": Series(steps, np.r_[np.ones(11), np.inf]),
    }
    shapes = {"dense/kernel": (2, 2), "dense/bias": (2,)}
    view = stability_view("r", scalars, shapes, stability_report(scalars))
    row = decode(view["rms"]["values"])
    np.testing.assert_allclose(row[:10], 1.0)
    assert np.isnan(row[10]) and np.isnan(row[11])  # the bias is missing there: no RMS over the layer
    (logits,) = view["logits"]
    assert logits["values"][11] is None and logits["nonfinite"] == [11]
    assert logits["spike_steps"] == [11]  # a blow-up after finite values is a spike (the report's rule)


def test_a_run_without_the_instruments_names_them(tmp_path):
    writer = ProbeWriter(tmp_path)
    for step in range(3):
        writer.write(ProbeRecord(step, {"grad_norm/dense": 1.0, "global/loss": 1.0}, {}))
    writer.close()
    apps = KgradPlugin(base_plugin.TBContext(logdir=str(tmp_path))).get_plugin_apps()
    response = Client(apps["/stability"]).get("/stability", query_string={"run": "kgrad"})
    view = json.loads(response.get_data())
    assert (view["rms"], view["logits"], view["attention"], view["loss"]) == (None, None, None, None)
    assert [part["instrument"] for part in view["missing"]] == ["optimizer", "logits", "attention"]
    unknown = Client(apps["/stability"]).get("/stability", query_string={"run": "nope"})
    assert unknown.status_code == 404 and "Unknown run: run='nope'" in unknown.get_data(as_text=True)


def test_a_real_fit_with_the_instruments_is_shown_as_read_logs_has_it(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="tanh", name="hidden"),
         keras.layers.Dense(3, activation="softmax", name="out")], name="m",
    )
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["optimizer", "logits"])
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[probe])
    scalars = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    apps = KgradPlugin(base_plugin.TBContext(logdir=str(tmp_path))).get_plugin_apps()
    view = json.loads(Client(apps["/stability"]).get("/stability", query_string={"run": "kgrad"}).get_data())
    assert view["steps"] == list(range(8)) and view["rms"]["layers"] == ["hidden", "out"]
    assert view["rms"]["aggregate"] == "rms"  # the probe logs the weight shapes
    matrix = decode(view["rms"]["values"]).reshape(2, 8)
    for row, layer in enumerate(("hidden", "out")):
        # The logged weights (kernels: the default statistics leave biases out), by their sizes.
        weights = [w for w in model.get_layer(layer).trainable_weights
                   if f"adam_rms/{layer}/{w.name}" in scalars]
        assert [w.name for w in weights] == ["kernel"]
        sizes = np.array([np.prod(w.shape) for w in weights], np.float64)[:, None]
        values = np.array([scalars[f"adam_rms/{layer}/{w.name}"].values for w in weights])
        expected = np.sqrt(np.sum(sizes * values**2, 0) / sizes.sum())
        np.testing.assert_allclose(matrix[row], expected, rtol=1e-6)
    (logits,) = view["logits"]
    np.testing.assert_allclose(logits["values"], scalars["logit_max_max/output"].values, rtol=1e-6)
    assert [part["instrument"] for part in view["missing"]] == ["attention"]


def test_the_html_report_holds_the_same_view(run, tmp_path):
    from kgrad.dashboard.html_report import report_data

    write_stability_run(tmp_path / "spiky")
    data = report_data(tmp_path)
    (name,) = data["runs"]
    served = views.RunView("kgrad", run[0]).stability()
    assert data["runs"][name]["stability"] == {**served, "run": name}
