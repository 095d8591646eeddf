"""The logs the dashboard tests look at, and what the dashboard reads from them.

`dashboard_logs` builds, once per test run (in pytest's base temp folder,
shared by the dashboard test modules and, under ``-n 2``, by both xdist
workers), a log directory holding:

- ``sigmoid_deep/`` and ``relu_deep/``: `kgrad demo` with 2 epochs;
- ``xss/kgrad``: a synthetic run whose layer names hold HTML;
- ``guard/kgrad``: a real fit whose `NonFiniteGuard` tripped on a NaN input.

The tests here check the dashboard's reader against `kgrad.read_logs` and
its views against `kgrad.health_report`, without a server.
"""

import base64
import io
import json
import os

import keras
import numpy as np
import pytest
from filelock import FileLock

import kgrad
from kgrad import demo
from kgrad.dashboard import events, views
from kgrad.logs.reading import Series
from kgrad.logs.record import ProbeRecord
from kgrad.logs.writer import ProbeWriter

XSS_LAYERS = ("dense_in", "<img src=x onerror=alert(1)>", "</script><script>alert(2)</script>")
DEMO_LAYERS = [f"hidden_{i}" for i in range(1, 9)] + ["output"]
GUARD_TRIP_STEP = 5  # the batch holding the NaN (batch size 4, sample 21)


def _xss_run(log_dir):
    writer = ProbeWriter(os.path.join(log_dir, "xss"))
    buckets = np.stack([np.linspace(-1, 1, 6)[:-1], np.linspace(-1, 1, 6)[1:], np.arange(1.0, 6.0)], axis=1)
    for step in range(0, 50, 10):
        scalars, histograms = {}, {}
        for index, layer in enumerate(XSS_LAYERS):
            scalars[f"grad_norm/{layer}"] = 10.0**-index
            scalars[f"weight_grad_norm/m/{layer}/kernel"] = 10.0**-index * (step + 1)
            histograms[f"grad_hist/{layer}"] = buckets * 10.0**-index
        writer.write(ProbeRecord(step, scalars, histograms))
    writer.close()


def _guard_run(log_dir):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, activation="tanh", name="hidden"),
            keras.layers.Dense(1, name="out"),
        ],
        name="m",
    )
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    x[GUARD_TRIP_STEP * 4 + 1, 0] = np.nan
    run_dir = os.path.join(log_dir, "guard")
    probe = kgrad.GradientProbe(run_dir, every_n_steps=1)
    guard = kgrad.NonFiniteGuard(log_dir=run_dir)
    model.fit(x, np.ones((32, 1)), batch_size=4, shuffle=False, verbose=0, callbacks=[probe, guard])
    assert guard.report is not None and guard.report.step == GUARD_TRIP_STEP


def build_dashboard_logs(base):
    """The log directory described in the module docstring, built once under ``base``."""
    log_dir = os.path.join(base, "kgrad_dashboard_logs")
    done = os.path.join(log_dir, ".complete")
    # The lock: under `-n 2` the second worker waits for the first one's build
    # (about 20 s of training) instead of training the same runs again.
    with FileLock(os.path.join(base, "kgrad_dashboard_logs.lock")):
        if not os.path.exists(done):
            demo.run_demo(log_dir, epochs=2, overwrite=True, out=io.StringIO())
            _xss_run(log_dir)
            _guard_run(log_dir)
            open(done, "w").close()
    return log_dir


@pytest.fixture(scope="session")
def dashboard_logs(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    # Each xdist worker has its own base temp folder inside the run's one: the
    # logs go there, so that both workers read the same (read-only) directory.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return build_dashboard_logs(str(base))


@pytest.fixture(scope="session")
def logs(dashboard_logs):
    return kgrad.read_logs(dashboard_logs)


def decode(base64_text, shape):
    return np.frombuffer(base64.b64decode(base64_text), "<f4").reshape(shape)


def weight_gradient_tags(scalars, layer):
    """The ``weight_grad_norm/.../<layer>/<weight>`` tags of a layer (with or without the model's name)."""
    return [tag for tag in scalars if tag.startswith("weight_grad_norm/") and tag.rsplit("/", 2)[-2] == layer]


def weight_gradient_norm(scalars, layer):
    """‖dJ/dw‖ of a layer from `kgrad.read_logs`' per-weight norms, step by step."""
    norms = [scalars[tag].values for tag in weight_gradient_tags(scalars, layer)]
    return np.sqrt(np.sum(np.square(norms), axis=0))


def test_reader_returns_every_step_of_read_logs(dashboard_logs, logs):
    runs = events.LogCache(dashboard_logs).runs()
    assert {"sigmoid_deep/kgrad", "relu_deep/kgrad", "xss/kgrad", "guard/kgrad"} <= set(runs)
    for run in ("sigmoid_deep/kgrad", "guard/kgrad", "xss/kgrad"):
        expected = logs[run]
        wanted = [tag for tag in expected["scalars"] if events._wanted_scalar(tag)]
        assert list(runs[run]["scalars"]) == wanted  # forward order kept
        for tag in wanted:
            np.testing.assert_array_equal(runs[run]["scalars"][tag].steps, expected["scalars"][tag].steps)
            np.testing.assert_allclose(runs[run]["scalars"][tag].values, expected["scalars"][tag].values)
        assert list(runs[run]["histograms"]) == list(expected["histograms"])
        for tag, series in expected["histograms"].items():
            np.testing.assert_allclose(runs[run]["histograms"][tag].values, series.values, rtol=1e-6)


def test_cache_rereads_only_runs_whose_files_changed(tmp_path):
    for run in ("a", "b"):
        writer = ProbeWriter(tmp_path / run)
        writer.write(ProbeRecord(0, {"grad_norm/dense": 1.0}, {}))
        writer.close()
    cache = events.LogCache(tmp_path, rescan_s=0)
    first = cache.runs()
    writer = ProbeWriter(tmp_path / "b")
    writer.write(ProbeRecord(7, {"grad_norm/dense": 2.0}, {}))
    writer.close()
    second = cache.runs()
    assert second["a/kgrad"] is first["a/kgrad"]
    assert second["b/kgrad"]["scalars"]["grad_norm/dense"].steps.tolist() == [0, 7]


def test_heatmap_rows_are_layers_in_forward_order_with_report_flags(dashboard_logs, logs):
    runs = events.LogCache(dashboard_logs).runs()
    health = {run.run: run for run in kgrad.health_report(logs)}
    for run in ("sigmoid_deep/kgrad", "relu_deep/kgrad"):
        heatmap = views.RunView(run, runs[run]).heatmap("weight_grad")
        assert heatmap["layers"] == DEMO_LAYERS
        assert heatmap["flags"] == [list(layer.flags) for layer in health[run].layers]
        matrix = decode(heatmap["values"], [len(DEMO_LAYERS), len(heatmap["steps"])])
        scalars = logs[run]["scalars"]
        (first_tag, *_) = weight_gradient_tags(scalars, "hidden_1")
        assert heatmap["steps"] == scalars[first_tag].steps.tolist()
        for row, layer in enumerate(DEMO_LAYERS):
            np.testing.assert_allclose(matrix[row], weight_gradient_norm(scalars, layer), rtol=1e-6)
    sigmoid = views.RunView("sigmoid_deep/kgrad", runs["sigmoid_deep/kgrad"]).heatmap("weight_grad")
    assert [("vanishing" in flags) for flags in sigmoid["flags"]] == [True] * 4 + [False] * 5


def test_update_ratio_heatmap_is_the_layers_update_over_its_weight_norm_at_every_step(dashboard_logs, logs):
    # Reference, step by step from the per-weight logs: ||dw_i|| = ratio_i * max(||w_i||, 1e-12)
    # (the probe's floor for weights that start at zero), and norms of a union add in squares.
    runs = events.LogCache(dashboard_logs).runs()
    health = {run.run: run for run in kgrad.health_report(logs)}
    for run in ("sigmoid_deep/kgrad", "relu_deep/kgrad"):
        heatmap = views.RunView(run, runs[run]).heatmap("update_ratio")
        matrix = decode(heatmap["values"], [len(DEMO_LAYERS), len(heatmap["steps"])])
        scalars = logs[run]["scalars"]
        for row, layer in enumerate(DEMO_LAYERS):
            weights = [tag[len("weight_grad_norm/"):] for tag in weight_gradient_tags(scalars, layer)]
            ratios = np.array([scalars[f"update_ratio/{weight}"].values for weight in weights])
            norms = np.array([scalars[f"weight_norm/{weight}"].values for weight in weights])
            update = np.sqrt(np.sum((ratios * np.maximum(norms, 1e-12)) ** 2, axis=0))
            expected = update / np.sqrt(np.sum(norms**2, axis=0))
            assert heatmap["steps"] == scalars[f"update_ratio/{weights[0]}"].steps.tolist()
            np.testing.assert_allclose(matrix[row], expected, rtol=1e-5)
            # The report's column is the same quantity's latest value.
            report_row = next(row for row in health[run].layers if row.layer == layer)
            np.testing.assert_allclose(report_row.update_ratio, expected[-1], rtol=1e-9)


def test_update_ratio_of_a_layer_with_two_logged_weights_combines_them_at_every_step():
    steps = np.array([0, 10])
    scalars = {
        "grad_norm/dense": Series(steps, np.array([1.0, 1.0])),
        "weight_grad_norm/dense/kernel": Series(steps, np.array([1.0, 1.0])),
        "weight_grad_norm/dense/bias": Series(steps, np.array([1.0, 1.0])),
        "update_ratio/dense/kernel": Series(steps, np.array([0.1, 0.01])),
        "weight_norm/dense/kernel": Series(steps, np.array([3.0, 3.0])),
        "update_ratio/dense/bias": Series(steps, np.array([0.2, 0.0])),
        "weight_norm/dense/bias": Series(steps, np.array([4.0, 4.0])),
    }
    heatmap = views.RunView("run/kgrad", {"scalars": scalars, "histograms": {}}).heatmap("update_ratio")
    # ||dw|| = sqrt((0.1 * 3)^2 + (0.2 * 4)^2) = sqrt(0.73) over ||w|| = 5; then 0.03 / 5.
    np.testing.assert_allclose(decode(heatmap["values"], [1, 2])[0], [np.sqrt(0.73) / 5, 0.006], rtol=1e-6)
    (run,) = kgrad.health_report({"kgrad": {"scalars": scalars, "histograms": {}}})
    assert run.layers[0].update_ratio == pytest.approx(0.006)


def test_first_flag_step_is_the_first_step_that_meets_the_flag():
    steps = np.array([0, 10, 20])
    scalars = {
        "grad_norm/early": Series(steps, np.array([0.5, 1e-4, 1e-6])),
        "grad_norm/late": Series(steps, np.array([0.5, 0.5, 0.5])),
        "activation_zero_fraction/late": Series(steps, np.array([0.0, 1.0, 1.0])),
        "grad_nonfinite/late": Series(steps, np.array([0.0, 0.0, 3.0])),
    }
    (run,) = kgrad.health_report({"kgrad": {"scalars": scalars, "histograms": {}}})
    early, late = run.layers
    assert early.first_flagged == (("vanishing", 10),)
    assert late.first_flagged == (("nonfinite", 20), ("dead", 10))


def test_summary_has_the_guard_report_and_the_nonfinite_timeline(dashboard_logs):
    runs = events.LogCache(dashboard_logs).runs()
    summary = views.RunView("guard/kgrad", runs["guard/kgrad"]).summary()
    (guard,) = summary["guard"]
    assert guard["step"] == GUARD_TRIP_STEP and guard["nan_count"] + guard["inf_count"] >= 1
    assert "Non-finite values at step 5" in guard["message"]
    # The replay's fields, as the report has them (a NaN input: it arrived with the data).
    assert (guard["born_in"], guard["replayed"], guard["batch_index"]) == ("data", True, GUARD_TRIP_STEP)
    # The tripped step's dJ/dw is NaN: its norm is said as NaN (not "not logged", not small).
    health = {row["layer"]: row for row in summary["health"]}
    for layer in ("hidden", "out"):
        assert health[layer]["grad_norm"] == "NaN" and health[layer]["nonfinite_norms"] == 1
        assert "nonfinite" in health[layer]["flags"] and "vanishing" not in health[layer]["flags"]
    norms = [entry for entry in summary["nonfinite"] if entry["norm"]]
    tags = {entry["tag"] for entry in norms}
    assert tags >= {"weight_grad_norm/hidden/kernel", "weight_grad_norm/out/kernel"}
    assert all(entry["steps"] == [GUARD_TRIP_STEP] and entry["counts"] == ["NaN"] for entry in norms)
    json.dumps(summary, allow_nan=False)  # standard JSON: NaN became null


def test_histogram_range_is_shared_by_every_layer_of_the_kind(dashboard_logs):
    runs = events.LogCache(dashboard_logs).runs()
    view = views.RunView("xss/kgrad", runs["xss/kgrad"])
    ranges = {tuple(view.histogram(f"grad_hist/{layer}")["range"]) for layer in XSS_LAYERS}
    assert ranges == {(-1.0, 1.0)}


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def headless_chromium():
    """A Selenium driver of Debian's chromium; skips the test only when it is not installed."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    if missing:
        pytest.skip(f"browser test needs Debian's chromium and chromium-driver; missing: {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1500,1200"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_for(driver, script, timeout_s=60):
    """Polls a JavaScript expression until it is truthy; returns its value."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = driver.execute_script(f"return {script}")
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for: {script}")


def test_reader_matches_read_logs_when_the_layout_changes_within_a_file(tmp_path):
    writer = ProbeWriter(tmp_path)
    for step in range(0, 300, 10):  # steps of 1 and 2 varint bytes: records of two lengths
        scalars = {"grad_norm/a": step + 0.5, "grad_nonfinite/a": 0.0, "activation_mean/a": 1.0}
        if step >= 150:  # a tag more from here on: a second layout
            scalars["grad_norm/b"] = -step
        writer.write(ProbeRecord(step, scalars, {"grad_hist/a": np.full([4, 3], step, np.float64)}))
    writer.close()
    expected = kgrad.read_logs(tmp_path)["kgrad"]
    got = events.read_run(events.find_runs(str(tmp_path))["kgrad"])
    assert list(got["scalars"]) == [
        "grad_norm/a",
        "grad_nonfinite/a",
        "grad_norm/b",
    ]  # activation_mean: not drawn
    for tag, series in got["scalars"].items():
        np.testing.assert_array_equal(series.steps, expected["scalars"][tag].steps)
        np.testing.assert_array_equal(series.values, expected["scalars"][tag].values)
    np.testing.assert_array_equal(
        got["histograms"]["grad_hist/a"].values, expected["histograms"]["grad_hist/a"].values
    )
