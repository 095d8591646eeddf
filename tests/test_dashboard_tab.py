"""The kgrad tab in a real ``tensorboard --logdir`` server, and in a real browser.

TensorBoard runs as a subprocess on a free loopback port (stopped by the
fixture); Debian's chromium, driven by Selenium through chromedriver, opens
the tab as a person would and the tests check what that person looks at.
"""

import base64
import http.client
import json
import time
import urllib.parse

import numpy as np
import pytest
from tensorboard_process import tensorboard_process
from test_dashboard_logs import (  # noqa: F401  (fixtures)
    DEMO_LAYERS,
    GUARD_TRIP_STEP,
    XSS_LAYERS,
    dashboard_logs,
    headless_chromium,
    logs,
    wait_for,
    weight_gradient_norm,
)

pytestmark = pytest.mark.slow  # a server subprocess, a browser: tens of seconds

RUNS = {"guard/kgrad", "relu_deep/kgrad", "sigmoid_deep/kgrad", "xss/kgrad"}
STARTUP_TIMEOUT_S = 120


def _get(port, raw_path):
    """(status, body text) of a GET sent as is: no client-side path normalization."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", raw_path)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def _route(port, route, **params):
    status, body = _get(port, f"/data/plugin/kgrad/{route}?{urllib.parse.urlencode(params)}")
    assert status == 200, body
    return json.loads(body)


@pytest.fixture(scope="module")
def server(dashboard_logs, tmp_path_factory):  # noqa: F811
    stderr_path = tmp_path_factory.mktemp("tensorboard") / "stderr.txt"
    with tensorboard_process(dashboard_logs, stderr_path) as (process, port):
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"tensorboard exited:\n{stderr_path.read_text()[-3000:]}")
            try:
                status, body = _get(port, "/data/plugin/kgrad/runs")
                if status == 200 and RUNS <= set(json.loads(body)["runs"]):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"no kgrad runs served in {STARTUP_TIMEOUT_S} s:\n{stderr_path.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield port


def test_plugin_is_listed_as_a_tab_loaded_from_an_es_module(server):
    status, body = _get(server, "/data/plugins_listing")
    listing = json.loads(body)["kgrad"]
    assert listing["enabled"] and listing["tab_name"] == "kgrad"
    assert listing["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/kgrad/index.js"}


def test_heatmap_route_serves_every_probed_step(server, logs):  # noqa: F811
    heatmap = _route(server, "heatmap", run="sigmoid_deep/kgrad", quantity="weight_grad")
    scalars = logs["sigmoid_deep/kgrad"]["scalars"]
    assert heatmap["layers"] == DEMO_LAYERS
    matrix = np.frombuffer(base64.b64decode(heatmap["values"]), "<f4").reshape(len(DEMO_LAYERS), -1)
    assert heatmap["steps"] == scalars["grad_norm/hidden_1"].steps.tolist()
    for row, layer in enumerate(DEMO_LAYERS):
        np.testing.assert_allclose(matrix[row], weight_gradient_norm(scalars, layer), rtol=1e-6)


OK_RUN = "sigmoid_deep/kgrad"
BAD_QUERIES = [
    ("runs", "x=1"),
    ("heatmap", "run=../../etc/passwd&quantity=grad"),
    ("heatmap", "run=/etc/passwd&quantity=grad"),
    ("heatmap", "run=%2e%2e%2f%2e%2e%2fetc%2fpasswd&quantity=grad"),
    ("heatmap", "run=..%2F..%2F..%2Fetc%2Fpasswd&quantity=grad"),
    ("heatmap", f"run={OK_RUN}&quantity=../../etc/passwd"),
    ("heatmap", f"run={OK_RUN}"),
    ("heatmap", "quantity=grad"),
    ("heatmap", f"run={OK_RUN}&quantity=grad&run={OK_RUN}"),
    ("heatmap", f"run={OK_RUN}&quantity=grad&path=/etc/passwd"),
    ("heatmap", f"run={OK_RUN}%00&quantity=grad"),
    ("heatmap", "run=" + "a" * 5000 + "&quantity=grad"),
    ("summary", "run=../../../../etc/passwd"),
    ("summary", "run=%2e%2e"),
    ("summary", "run="),
    ("summary", ""),
    ("histogram", f"run={OK_RUN}&tag=../../../../etc/passwd"),
    ("histogram", f"run={OK_RUN}&tag=%2e%2e%2f%2e%2e%2fetc%2fpasswd"),
    ("histogram", f"run={OK_RUN}&tag=grad_norm/hidden_1"),  # a scalar tag
    ("histogram", "run=/etc&tag=passwd"),
    ("histogram", f"run={OK_RUN}"),
]
BAD_PATHS = [
    "/data/plugin/kgrad/..%2f..%2f..%2fetc%2fpasswd",
    "/data/plugin/kgrad/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/data/plugin/kgrad/plugin.py",
    "/data/plugin/kgrad/static/index.js",
    "/data/plugin/kgrad/index.js/../../../../etc/passwd",
]


def _assert_refused(status, body):
    assert 400 <= status < 500, (status, body[:300])
    for leak in ("root:", "Traceback", "import ", "def "):
        assert leak not in body, body[:300]


@pytest.mark.parametrize("route,query", BAD_QUERIES)
def test_unknown_or_malformed_parameters_get_a_4xx_without_file_content(server, route, query):
    status, body = _get(server, f"/data/plugin/kgrad/{route}?{query}")
    _assert_refused(status, body)
    assert body.strip()  # a message that says what was wrong


@pytest.mark.parametrize("path", BAD_PATHS)
def test_paths_outside_the_routes_get_a_4xx_without_file_content(server, path):
    _assert_refused(*_get(server, path))


@pytest.fixture(scope="module")
def tab(server):
    driver = headless_chromium()
    try:
        driver.get(f"http://127.0.0.1:{server}/#kgrad")
        frame = wait_for(driver, "document.querySelector('iframe')")
        driver.switch_to.frame(frame)
        wait_for(driver, "document.querySelector('.body[data-state=ready]')")
        yield driver
    finally:
        driver.quit()


def _column(run):
    return f'section.run-column[data-run="{run}"]'


def _rows(driver, run):
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' .row-label')]"
        ".map((r) => [r.dataset.layer, r.dataset.flags, r.querySelector('.name').textContent])",
        _column(run),
    )


def test_tab_shows_one_row_per_layer_in_forward_order_with_the_vanishing_band(tab):
    sigmoid, relu = _rows(tab, "sigmoid_deep/kgrad"), _rows(tab, "relu_deep/kgrad")
    assert [layer for layer, _, _ in sigmoid] == DEMO_LAYERS == [name for _, _, name in sigmoid]
    assert [layer for layer, _, _ in relu] == DEMO_LAYERS
    assert ["vanishing" in flags for _, flags, _ in sigmoid] == [True] * 4 + [False] * 5
    assert not any("vanishing" in flags for _, flags, _ in relu)
    # One colour scale for the runs side by side: a single legend.
    assert len(tab.find_elements("css selector", ".legend")) == 1


def _cell_offset(driver, canvas, row, column):
    layers, steps = int(canvas.get_attribute("data-layers")), int(canvas.get_attribute("data-steps"))
    width, height = driver.execute_script(
        "const b = arguments[0].getBoundingClientRect(); return [b.width, b.height]", canvas
    )
    return (column + 0.5) / steps * width - width / 2, (row + 0.5) / layers * height - height / 2


def test_hover_shows_the_logged_value_and_click_shows_the_histograms(tab, logs):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = tab.find_element("css selector", _column("sigmoid_deep/kgrad") + " canvas.heatmap-canvas")
    # All of it in the window: an action's offset is from the centre of the element's visible part.
    tab.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    scalars = logs["sigmoid_deep/kgrad"]["scalars"]
    steps = scalars["grad_norm/hidden_1"].steps.tolist()
    column = len(steps) // 2
    dx, dy = _cell_offset(tab, canvas, 0, column)
    ActionChains(tab).move_to_element_with_offset(canvas, round(dx), round(dy)).perform()
    tip = tab.find_element("css selector", ".tooltip")
    wait_for(tab, "!document.querySelector('.tooltip').hidden")
    assert tip.get_attribute("data-layer") == "hidden_1"
    step = int(tip.get_attribute("data-step"))
    expected = weight_gradient_norm(scalars, "hidden_1")[steps.index(step)]
    shown = float(tip.find_element("css selector", ".tip-value").text.split("=")[1])
    assert abs(column - steps.index(step)) <= 1
    np.testing.assert_allclose(shown, expected, rtol=1e-3)
    ActionChains(tab).click().perform()
    wait_for(
        tab, "document.querySelectorAll('.histograms[data-layer=hidden_1] figure.histogram').length >= 2"
    )
    figures = tab.execute_script(
        "return [...document.querySelectorAll('figure.histogram')]"
        ".map((f) => [f.dataset.run, f.dataset.tag, f.querySelector('canvas').dataset.steps])"
    )
    shown = {run: (tag, int(count)) for run, tag, count in figures}
    assert set(shown) == {"sigmoid_deep/kgrad", "relu_deep/kgrad"}  # the same layer, side by side
    tag, count = shown["sigmoid_deep/kgrad"]
    assert tag in logs["sigmoid_deep/kgrad"]["histograms"] and "/hidden_1" in tag
    assert count == len(logs["sigmoid_deep/kgrad"]["histograms"][tag].steps)  # every probed step


def test_tripped_guard_shows_on_the_nonfinite_timeline(tab):
    column = tab.find_element("css selector", _column("guard/kgrad"))
    report = column.find_element("css selector", ".guard-report")
    assert report.get_attribute("data-guard-step") == str(GUARD_TRIP_STEP)
    assert f"tripped at step {GUARD_TRIP_STEP}" in report.text
    assert column.find_elements("css selector", ".timeline-row .mark")
    # The NaN dJ/dw of the tripped step, as the health table and the timeline say it.
    norms = [cell.text for cell in column.find_elements("css selector", ".health td.col-grad_norm")]
    assert norms == ["NaN", "NaN"]
    rows = [row.get_attribute("data-tag") for row in column.find_elements("css selector", ".timeline-row")]
    assert "weight_grad_norm/hidden/kernel" in rows


def test_html_in_layer_names_renders_as_text(tab):
    from selenium.common.exceptions import NoAlertPresentException

    rows = _rows(tab, "xss/kgrad")
    assert [layer for layer, _, _ in rows] == list(XSS_LAYERS) == [name for _, _, name in rows]
    assert tab.execute_script("return document.querySelectorAll('img, script:not([type])').length") == 0
    with pytest.raises(NoAlertPresentException):
        tab.switch_to.alert.text  # noqa: B018
