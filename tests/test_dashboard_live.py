"""The kgrad tab shows the steps of a run still training, written after it first loaded.

The run's writer stays open, as in a ``fit`` that is still going, and flushes
more steps while the plugin (in process, then in a real TensorBoard server
watched by chromium) already answered for the first ones.
"""

import base64
import json
import time
import urllib.request

import numpy as np
import pytest
from tensorboard.plugins import base_plugin
from tensorboard_process import tensorboard_process
from test_dashboard_logs import headless_chromium, wait_for
from werkzeug.test import Client

from kgrad.dashboard.plugin import KgradPlugin
from kgrad.logs.record import ProbeRecord
from kgrad.logs.writer import ProbeWriter

LAYERS = ("dense", "dense_1")
FIRST_STEPS, LATER_STEPS = [0, 10, 20], [30, 40]
# The plugin lists the log directory every 2 s and the page asks every 10 s; time enough for both.
REFRESH_TIMEOUT_S = 60


def _write(writer, steps):
    for step in steps:
        scalars = {}
        for index, layer in enumerate(LAYERS):
            scalars[f"grad_norm/{layer}"] = (step + 1) * 10.0**-index
            scalars[f"weight_grad_norm/{layer}/kernel"] = (step + 2) * 10.0**-index
        writer.write(ProbeRecord(step, scalars, {}))
    writer.flush()  # on disk, the file still open: training goes on


@pytest.fixture
def training(tmp_path):
    """A run being written: its first steps on disk, its writer open."""
    writer = ProbeWriter(tmp_path)
    _write(writer, FIRST_STEPS)
    yield tmp_path, writer
    writer.close()


def _get(app, route, **query):
    response = Client(app).get(f"/{route}", query_string=query)
    assert response.status_code == 200, response.get_data(as_text=True)
    return json.loads(response.get_data())


def test_plugin_serves_steps_written_after_its_first_answer(training):
    log_dir, writer = training
    apps = KgradPlugin(base_plugin.TBContext(logdir=str(log_dir))).get_plugin_apps()
    first = _get(apps["/runs"], "runs")
    assert first["runs"] == ["kgrad"]
    assert _get(apps["/heatmap"], "heatmap", run="kgrad", quantity="grad")["steps"] == FIRST_STEPS
    _write(writer, LATER_STEPS)
    deadline = time.monotonic() + REFRESH_TIMEOUT_S
    while True:
        heatmap = _get(apps["/heatmap"], "heatmap", run="kgrad", quantity="grad")
        if heatmap["steps"] != FIRST_STEPS or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert heatmap["steps"] == FIRST_STEPS + LATER_STEPS
    matrix = np.frombuffer(base64.b64decode(heatmap["values"]), "<f4").reshape(len(LAYERS), -1)
    np.testing.assert_allclose(matrix[0], [step + 1.0 for step in FIRST_STEPS + LATER_STEPS])
    summary = _get(apps["/summary"], "summary", run="kgrad")
    assert (summary["probes"], summary["last_step"]) == (5, LATER_STEPS[-1])
    # The page learns of it from the run's revision.
    assert _get(apps["/runs"], "runs")["revisions"]["kgrad"] != first["revisions"]["kgrad"]


def _wait_for_runs(port, process, stderr_path):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"tensorboard exited:\n{stderr_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/kgrad/runs") as answer:
                if json.loads(answer.read())["runs"]:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"no kgrad run served in 120 s:\n{stderr_path.read_text()[-3000:]}")


_SHOWN = """
const canvas = document.querySelector('canvas.heatmap-canvas');
return [Number(canvas.dataset.steps),
        [...document.querySelectorAll('.step-axis .tick')].map((t) => t.textContent),
        document.querySelector('table.health caption').textContent];
"""


@pytest.mark.slow  # a server subprocess, a browser, a wait for the page's next look
def test_tab_shows_steps_written_while_it_is_open(training, tmp_path_factory):
    log_dir, writer = training
    stderr_path = tmp_path_factory.mktemp("tensorboard") / "stderr.txt"
    with tensorboard_process(log_dir, stderr_path) as (process, port):
        _wait_for_runs(port, process, stderr_path)
        driver = headless_chromium()
        try:
            driver.get(f"http://127.0.0.1:{port}/#kgrad")
            driver.switch_to.frame(wait_for(driver, "document.querySelector('iframe')"))
            wait_for(driver, "document.querySelector('.body[data-state=ready]')")
            driver.execute_script("window.kgradTestMarker = 'no reload'")
            steps, ticks, caption = driver.execute_script(_SHOWN)
            assert steps == len(FIRST_STEPS) and ticks[-1] == str(FIRST_STEPS[-1])
            assert caption.startswith("3 probes, steps 0..20")
            _write(writer, LATER_STEPS)
            wait_for(
                driver,
                "Number(document.querySelector('canvas.heatmap-canvas').dataset.steps)"
                f" === {len(FIRST_STEPS) + len(LATER_STEPS)}",
                timeout_s=REFRESH_TIMEOUT_S,
            )
            steps, ticks, caption = driver.execute_script(_SHOWN)
            assert ticks[-1] == str(LATER_STEPS[-1]) and caption.startswith("5 probes, steps 0..40")
            assert driver.execute_script("return window.kgradTestMarker") == "no reload"
        finally:
            driver.quit()
