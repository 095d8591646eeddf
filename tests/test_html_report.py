"""``kgrad report LOG_DIR --html FILE``: parsed as HTML, and opened in chromium from disk."""

import html.parser
import json
import subprocess
import sys

import numpy as np
import pytest
from test_dashboard_logs import (  # noqa: F401  (fixtures)
    DEMO_LAYERS,
    XSS_LAYERS,
    dashboard_logs,
    headless_chromium,
    logs,
    wait_for,
)

import kgrad
from kgrad.dashboard.html_report import script_json


class _ReportParser(html.parser.HTMLParser):
    """Collects the static health rows, the embedded JSON and every tag seen."""

    def __init__(self):
        super().__init__()
        self.rows, self.tags, self.scripts = [], [], []
        self._in_data_script = False
        self._run = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if tag == "table":
            self._run = attrs.get("data-run")
        if tag == "tr" and "data-layer" in attrs:
            self.rows.append((self._run, attrs["data-layer"], attrs["data-flags"], attrs["data-grad-norm"]))
        if tag == "script":
            self.scripts.append(attrs)
            self._in_data_script = attrs.get("id") == "kgrad-data"

    def handle_data(self, data):
        if self._in_data_script:
            self.data = json.loads(data)
            self._in_data_script = False


@pytest.fixture(scope="module")
def report_file(dashboard_logs, tmp_path_factory):  # noqa: F811
    path = tmp_path_factory.mktemp("html") / "report.html"
    command = [sys.executable, "-m", "kgrad.cli", "report", dashboard_logs, "--html", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr  # flagged: the CI gate is unchanged
    assert f"HTML report: {path}" in result.stdout
    return path


@pytest.fixture(scope="module")
def parsed(report_file):
    parser = _ReportParser()
    parser.feed(report_file.read_text(encoding="utf-8"))
    return parser


def test_report_holds_the_health_table_of_every_kgrad_run(parsed, logs):  # noqa: F811
    expected = {run.run: run for run in kgrad.health_report(logs)}
    runs = {run for run, _, _, _ in parsed.rows}
    assert runs == set(expected) == set(parsed.data["info"]["runs"])
    for run, health in expected.items():
        rows = [row for row in parsed.rows if row[0] == run]
        assert [layer for _, layer, _, _ in rows] == [layer.layer for layer in health.layers]
        assert [flags.split() for _, _, flags, _ in rows] == [list(layer.flags) for layer in health.layers]
        norms = [float("nan") if norm == "-" else float(norm) for *_, norm in rows]
        np.testing.assert_allclose(norms, [layer.grad_norm for layer in health.layers])
    sigmoid = [flags for run, _, flags, _ in parsed.rows if run == "sigmoid_deep/kgrad"]
    assert sigmoid == ["vanishing"] * 4 + [""] * 5


def test_report_embeds_every_step_and_needs_no_network(parsed, report_file, logs):  # noqa: F811
    heatmap = parsed.data["runs"]["relu_deep/kgrad"]["heatmaps"]["grad"]
    assert heatmap["layers"] == DEMO_LAYERS
    assert heatmap["steps"] == logs["relu_deep/kgrad"]["scalars"]["grad_norm/hidden_1"].steps.tolist()
    assert all(not attrs.get("src") for attrs in parsed.scripts)  # inline only
    text = report_file.read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text and "<link" not in text


def test_layer_names_with_html_stay_text_in_the_file(parsed, report_file):
    xss_rows = [layer for run, layer, _, _ in parsed.rows if run == "xss/kgrad"]
    assert xss_rows == list(XSS_LAYERS)  # html.parser unescaped the attributes back
    assert "img" not in parsed.tags
    assert parsed.tags.count("script") == 2  # the JSON and the module: no injected one
    text = report_file.read_text(encoding="utf-8")
    assert "<img src=x" not in text and "</script><script>alert" not in text


def test_script_json_escapes_what_could_close_the_script():
    text = script_json({"name": "</script><b>&"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"name": "</script><b>&"}


@pytest.mark.slow
def test_report_opens_from_disk_in_chromium(report_file, logs):  # noqa: F811
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.action_chains import ActionChains

    driver = headless_chromium()
    try:
        driver.get(report_file.as_uri())
        wait_for(driver, "document.querySelector('.body[data-state=ready]')")
        rows = driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map((r) => [r.dataset.layer, r.dataset.flags])",  # noqa: E501
            'section.run-column[data-run="sigmoid_deep/kgrad"] .row-label',
        )
        assert [layer for layer, _ in rows] == DEMO_LAYERS
        assert ["vanishing" in flags for _, flags in rows] == [True] * 4 + [False] * 5
        names = driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map((n) => n.textContent)",
            'section.run-column[data-run="xss/kgrad"] .row-label .name',
        )
        assert names == list(XSS_LAYERS)
        assert driver.execute_script("return document.querySelectorAll('img').length") == 0
        with pytest.raises(NoAlertPresentException):
            driver.switch_to.alert.text  # noqa: B018
        canvas = driver.find_element("css selector", 'section.run-column[data-run="relu_deep/kgrad"] canvas')
        width, height = canvas.size["width"], canvas.size["height"]
        ActionChains(driver).move_to_element_with_offset(
            canvas, 0, round(-height / 2 + height / 18)
        ).perform()
        tip = driver.find_element("css selector", ".tooltip")
        assert tip.get_attribute("data-layer") == "hidden_1"
        step = int(tip.get_attribute("data-step"))
        scalars = logs["relu_deep/kgrad"]["scalars"]
        weights = [
            t for t in scalars if t.startswith("weight_grad_norm/") and t.rsplit("/", 2)[-2] == "hidden_1"
        ]
        index = scalars[weights[0]].steps.tolist().index(step)
        expected = np.sqrt(sum(scalars[t].values[index] ** 2 for t in weights))
        np.testing.assert_allclose(float(tip.get_attribute("data-value")), expected, rtol=1e-6)
        assert width > 0
    finally:
        driver.quit()


@pytest.mark.slow
def test_the_tooltip_of_the_last_cell_stays_in_the_window_on_one_line_per_value(report_file):
    from selenium.webdriver.common.action_chains import ActionChains

    driver = headless_chromium()
    try:
        driver.set_window_size(1400, 800)  # two runs side by side: the last one ends at the right edge
        driver.get(report_file.as_uri())
        wait_for(driver, "document.querySelector('.body[data-state=ready]')")
        canvases = driver.find_elements("css selector", "canvas.heatmap-canvas")
        canvas = max(canvases, key=lambda c: c.rect["x"] + c.rect["width"])
        width, height = canvas.size["width"], canvas.size["height"]
        for dx, dy in ((width / 2 - 2, -height / 2 + 2), (width / 2 - 2, height / 2 - 2)):
            ActionChains(driver).move_to_element_with_offset(canvas, round(dx), round(dy)).perform()
            wait_for(driver, "!document.querySelector('.tooltip').hidden")
            box, inner, lines = driver.execute_script(
                "const t = document.querySelector('.tooltip'); const b = t.getBoundingClientRect();"
                "return [[b.left, b.top, b.right, b.bottom], [window.innerWidth, window.innerHeight],"
                " (() => { const r = document.createRange();"  # one rect per line of its text
                " r.selectNodeContents(document.querySelector('.tooltip .tip-value'));"
                " return r.getClientRects().length; })()]"
            )
            assert 0 <= box[0] and box[2] <= inner[0], (box, inner)  # not cut at the right edge
            assert 0 <= box[1] and box[3] <= inner[1], (box, inner)
            assert lines == 1  # "dJ/dw norm = 8.257e-7", not broken over two lines
    finally:
        driver.quit()


def test_unwritable_html_path_is_a_usage_error(dashboard_logs, tmp_path):  # noqa: F811
    target = tmp_path / "missing-folder" / "report.html"
    command = [sys.executable, "-m", "kgrad.cli", "report", dashboard_logs, "--html", str(target)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "--html" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_row_labels_of_a_hundred_layers_are_full_size_text_on_their_rows(tmp_path):
    # At 5 px a row (540 px for 100 layers), labels clipped to their rows were
    # illegible slivers: every third is drawn at full size, centred on its row.
    from benchmarks.dashboard_scale import write_synthetic_run

    names = write_synthetic_run(tmp_path / "logs", 100, 20, histogram_layers=0, every_n_steps=1)
    path = tmp_path / "report.html"
    command = [sys.executable, "-m", "kgrad.cli", "report", str(tmp_path / "logs"), "--html", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert f"HTML report: {path}" in result.stdout, result.stderr
    driver = headless_chromium()
    try:
        driver.get(path.as_uri())
        wait_for(driver, "document.querySelector('.body[data-state=ready]')")
        labels = driver.execute_script(
            "return [...document.querySelectorAll('.row-label')].map((row) => {"
            " const r = row.getBoundingClientRect(), n = row.querySelector('.name').getBoundingClientRect();"
            " const name = row.querySelector('.name'), x = (n.left + n.right) / 2;"
            # Clipped text is not hit: the name's top and bottom edges are seen only when drawn.
            " const seen = [n.top + 2, n.bottom - 2].every((y) => document.elementFromPoint(x, y) === name);"
            " return [row.dataset.layer, !row.classList.contains('hidden-text'), r.top, r.bottom,"
            " n.top, n.bottom, getComputedStyle(name).fontSize, seen]; })"
        )
    finally:
        driver.quit()
    assert [label[0] for label in labels] == names
    shown = [label for label in labels if label[1]]
    assert len(shown) == 34  # every third row: 12 px of text over 5 px rows
    for _, _, row_top, row_bottom, top, bottom, font_size, seen in shown:
        assert row_bottom - row_top < 6 and font_size == "11px"
        assert bottom - top >= 11 and seen  # the whole line, not a 5 px slice of it
        assert abs((top + bottom) / 2 - (row_top + row_bottom) / 2) < 1  # on its own row
    for above, below in zip(shown, shown[1:]):
        assert above[5] <= below[4]  # no two labels overlap


def test_a_single_run_folder_is_named_by_the_folder_not_dot(tmp_path):
    from kgrad.logs.record import ProbeRecord
    from kgrad.logs.writer import ProbeWriter

    run_dir = tmp_path / "run1"
    writer = ProbeWriter(str(run_dir))
    for step in (0, 1):
        writer.write(ProbeRecord(step, {"grad_norm/dense": 1.0, "weight_grad_norm/dense/kernel": 0.5}, {}))
    writer.close()
    page = tmp_path / "report.html"
    kgrad.write_html_report(str(run_dir / "kgrad"), str(page))
    text = page.read_text()
    assert "<h2>kgrad</h2>" in text and "<h2>.</h2>" not in text
