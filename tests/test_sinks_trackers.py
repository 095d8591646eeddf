"""W&B (offline), MLflow (a local store) and JSON Lines get what TensorBoard gets, value for value.

One fit writes TensorBoard's event files and the three sinks; what each
tracker recorded is read back its own way (the W&B run file, MLflow's
``get_metric_history`` and artifacts, the JSON lines) and compared with the
event files read by `kgrad.read_logs`: the same tags, the same steps, the
same float32 values, the same histogram edges and counts. A second fit trips
a `kgrad.NonFiniteGuard` that shares the sinks with the probe: the guard's
report and the HTML reports reach every tracker. tests/jax runs the same
tests on Keras' JAX backend.
"""

import json
import os

import keras
import numpy as np
import pytest
from tracker_readers import mlflow_series, wandb_run, wandb_series

import kgrad
from kgrad.dashboard.events import find_runs, read_run
from kgrad.dashboard import html_report

wandb = pytest.importorskip("wandb")
mlflow = pytest.importorskip("mlflow")

EPOCHS, BATCH, SAMPLES, NAN_STEP = 2, 4, 16, 1


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="relu", name="hidden"),
        keras.layers.Dense(3, activation="softmax", name="out"),
    ])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    return model


def _data(nan_step=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 4)).astype("float32")
    if nan_step is not None:
        x[(nan_step % (SAMPLES // BATCH)) * BATCH] = np.nan
    return x, np.arange(SAMPLES) % 3


def _tracked_fit(folder, guard_action=None):
    """A fit with TensorBoard and the three sinks (and, with ``guard_action``, a guard sharing them)."""
    log_dir, jsonl = str(folder / "logs"), str(folder / "kgrad.jsonl")
    mlflow.set_tracking_uri("file:" + str(folder / "mlruns"))
    run = wandb.init(mode="offline", dir=str(folder), project="kgrad-test")
    sinks = [kgrad.WandbSink(), kgrad.MlflowSink(), kgrad.JsonLinesSink(jsonl)]
    probe = kgrad.GradientProbe(log_dir, every_n_steps=2, instruments=["optimizer", "logits"], sinks=sinks)
    callbacks = [probe]
    if guard_action is not None:
        callbacks.append(kgrad.NonFiniteGuard(action=guard_action, log_dir=log_dir, sinks=sinks))
    model = _model()
    with mlflow.start_run() as mlflow_run:
        model.fit(*_data(NAN_STEP if guard_action else None), epochs=EPOCHS, batch_size=BATCH,
                  shuffle=False, verbose=0, callbacks=callbacks)
    run_dir = os.path.dirname(run.dir)
    run.finish()
    history, summary, files = wandb_run(run_dir)
    return {
        "log_dir": log_dir, "tensorboard": kgrad.read_logs(log_dir)["kgrad"], "sinks": sinks,
        "wandb": history, "wandb_summary": summary, "wandb_files": files,
        "mlflow": mlflow.MlflowClient(), "mlflow_run": mlflow_run,
        "jsonl": [json.loads(line) for line in open(jsonl, encoding="utf-8")],
    }


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    return _tracked_fit(tmp_path_factory.mktemp("trackers"))


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    return _tracked_fit(tmp_path_factory.mktemp("guarded"), guard_action="stop")


def _same_float32(got, expected):
    np.testing.assert_array_equal(np.asarray(got, np.float64).astype(np.float32),
                                  np.asarray(expected, np.float64).astype(np.float32))


def _edges_and_counts(buckets):
    return np.append(buckets[:, 0], buckets[-1, 1]).tolist(), buckets[:, 2].tolist()


def _media_key(key):
    """The logged key of a flattened media field (``kgrad/grad_hist/out/values``: ``kgrad/grad_hist/out``)."""
    head, _, field = key.rpartition("/")
    return head if field in ("_type", "values", "bins", "path", "sha256", "size") else key


def test_every_record_reaches_every_sink(tracked):
    steps = tracked["tensorboard"]["scalars"]["grad_norm/hidden"].steps.tolist()
    assert steps == list(range(0, EPOCHS * SAMPLES // BATCH, 2))
    assert "adam_rms/hidden/kernel" in tracked["tensorboard"]["scalars"]  # a stability signal
    for sink in tracked["sinks"]:
        # The probed steps, and the HTML report for W&B and MLflow.
        assert (sink.delivered, sink.dropped) == (len(steps) + sink.wants_html_report, 0), sink


def test_wandb_offline_run_holds_every_tag_step_value_and_histogram(tracked):
    history, tensorboard = tracked["wandb"], tracked["tensorboard"]
    for tag, series in tensorboard["scalars"].items():
        got = wandb_series(history, f"kgrad/{tag}")
        assert list(got) == series.steps.tolist(), tag
        _same_float32(list(got.values()), series.values)
    for tag, series in tensorboard["histograms"].items():
        counts = wandb_series(history, f"kgrad/{tag}/values")
        bins = wandb_series(history, f"kgrad/{tag}/bins")
        assert list(counts) == list(bins) == series.steps.tolist(), tag
        for step, buckets in zip(series.steps.tolist(), series.values):
            assert (bins[step], counts[step]) == _edges_and_counts(buckets), (tag, step)
        assert wandb_series(history, f"kgrad/{tag}/_type")[0] == "histogram"
    logged = {_media_key(key) for row in history for key in row if key.startswith("kgrad/")}
    written = {f"kgrad/{tag}" for tag in [*tensorboard["scalars"], *tensorboard["histograms"]]}
    assert logged == written | {"kgrad/step", "kgrad/report"}


def test_mlflow_metrics_and_histogram_artifacts_hold_every_value(tracked):
    client, run_id = tracked["mlflow"], tracked["mlflow_run"].info.run_id
    tensorboard = tracked["tensorboard"]
    for tag, series in tensorboard["scalars"].items():
        got = mlflow_series(client, run_id, f"kgrad/{tag}")
        assert sorted(got) == series.steps.tolist(), tag
        _same_float32([got[step] for step in series.steps.tolist()], series.values)
    assert set(client.get_run(run_id).data.metrics) == {f"kgrad/{tag}" for tag in tensorboard["scalars"]}
    artifacts = mlflow.get_run(run_id).info.artifact_uri
    steps = tensorboard["histograms"]["grad_hist/hidden"].steps.tolist()
    for index, step in enumerate(steps):
        histograms = mlflow.artifacts.load_dict(f"{artifacts}/kgrad/histograms/step_{step:09d}.json")
        assert set(histograms) == set(tensorboard["histograms"])
        for tag, series in tensorboard["histograms"].items():
            edges, counts = _edges_and_counts(series.values[index])
            assert (histograms[tag]["edges"], histograms[tag]["counts"]) == (edges, counts), (tag, step)


def test_json_lines_hold_every_record(tracked):
    lines, tensorboard = tracked["jsonl"], tracked["tensorboard"]
    assert [line["record"] for line in lines] == ["probe"] * len(lines)
    by_step = {line["step"]: line for line in lines}
    for tag, series in tensorboard["scalars"].items():
        _same_float32([by_step[step][tag] for step in series.steps.tolist()], series.values)
    for tag, series in tensorboard["histograms"].items():
        for step, buckets in zip(series.steps.tolist(), series.values):
            histogram = by_step[step]["histograms"][tag]
            assert (histogram["edges"], histogram["counts"]) == _edges_and_counts(buckets), (tag, step)
    keys = {key for line in lines for key in line} - {"record", "step", "tape", "histograms"}
    assert keys == set(tensorboard["scalars"])


def test_the_html_report_is_attached_as_kgrad_report_html_renders_it(tracked):
    expected = html_report.render_html(html_report.report_data(tracked["log_dir"]))
    (row,) = [row for row in tracked["wandb"] if "kgrad/report/path" in row]
    assert row["kgrad/report/_type"] == "html-file"
    last_step = tracked["tensorboard"]["scalars"]["grad_norm/hidden"].steps[-1]
    assert row["kgrad/step"] == last_step
    with open(os.path.join(tracked["wandb_files"], row["kgrad/report/path"]), encoding="utf-8") as file:
        assert file.read() == expected
    run_id = tracked["mlflow_run"].info.run_id
    artifacts = mlflow.get_run(run_id).info.artifact_uri
    assert mlflow.artifacts.load_text(f"{artifacts}/kgrad/report.html") == expected


def _tensorboard_guard_report(log_dir):
    ((step, text),) = read_run(find_runs(log_dir)["kgrad"])["texts"]["guard/report"]
    return step, json.loads(text)


def test_a_guard_trip_reaches_every_sink_with_its_report(guarded):
    step, fields = _tensorboard_guard_report(guarded["log_dir"])
    assert step == NAN_STEP and fields["nan_count"] > 0 and fields["step"] == NAN_STEP
    (line,) = [line for line in guarded["jsonl"] if line["record"] == "guard_report"]
    assert line == {"record": "guard_report", "step": NAN_STEP, "report": fields}
    assert guarded["wandb_summary"]["kgrad/guard_report"] == fields
    assert wandb_series(guarded["wandb"], "kgrad/guard/nan_count") == {NAN_STEP: fields["nan_count"]}
    assert wandb_series(guarded["wandb"], "kgrad/guard/inf_count") == {NAN_STEP: fields["inf_count"]}
    client, run_id = guarded["mlflow"], guarded["mlflow_run"].info.run_id
    assert mlflow_series(client, run_id, "kgrad/guard/nan_count") == {NAN_STEP: fields["nan_count"]}
    artifacts = mlflow.get_run(run_id).info.artifact_uri
    assert mlflow.artifacts.load_dict(f"{artifacts}/kgrad/guard_report_step_{NAN_STEP}.json") == fields
    assert client.get_run(run_id).data.tags["kgrad.guard"] == fields["message"].splitlines()[0]


def test_a_guard_trip_attaches_the_html_report_then_and_at_the_end(guarded):
    reports = [row for row in guarded["wandb"] if "kgrad/report/path" in row]
    assert [row["kgrad/step"] for row in reports][0] == NAN_STEP and len(reports) == 2
    for row in reports:
        with open(os.path.join(guarded["wandb_files"], row["kgrad/report/path"]), encoding="utf-8") as file:
            assert "NaN" in file.read()
    artifacts = mlflow.get_run(guarded["mlflow_run"].info.run_id).info.artifact_uri
    page = mlflow.artifacts.load_text(f"{artifacts}/kgrad/report_nonfinite_step_{NAN_STEP}.html")
    assert page.startswith("<!DOCTYPE html>") and "kgrad-data" in page


@pytest.mark.parametrize("width, height", [(1400, 900), (700, 900)])
def test_the_page_wandb_stored_opens_in_chromium_with_every_layer(tracked, width, height):
    from test_dashboard_logs import headless_chromium, wait_for

    (row,) = [row for row in tracked["wandb"] if "kgrad/report/path" in row]
    page = os.path.join(tracked["wandb_files"], row["kgrad/report/path"])
    driver = headless_chromium()
    try:
        driver.set_window_size(width, height)
        driver.get("file://" + page)
        wait_for(driver, "document.querySelector('.body[data-state=ready]')")
        layers = driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map((r) => r.dataset.layer)",
            "section.run-column .row-label")
        assert list(dict.fromkeys(layers)) == ["hidden", "out"]  # the heatmap's rows, in forward order
        overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a {width} px window"
        driver.save_screenshot(os.path.join(os.path.dirname(tracked["log_dir"]), f"wandb_report_{width}.png"))
    finally:
        driver.quit()
