"""The stability view of the kgrad tab, in a real TensorBoard server and headless chromium.

Three runs written with kgrad's own writer: ``spiky`` with every stability
signal and spikes planted at known steps (`test_dashboard_stability`), ``partial``
with adam_rms only and no weight shapes, ``plain`` with none. At 1400x900, then
resized to 1000x700 and 800x600 without a reload: the view is drawn, its heatmap
has a row per layer and a column per step, every spike ring sits on its step's
column, the loss spike names what moved first, nothing is clipped, and the page
logs no JavaScript error. Screenshots go to ``KGRAD_TAB_SCREENSHOTS`` when set.
The HTML report, opened from disk, draws the same view.
"""

import contextlib
import json
import os
import time
import urllib.request

import pytest
from tensorboard_process import tensorboard_process
from test_dashboard_logs import CHROMEDRIVER, CHROMIUM, wait_for
from test_dashboard_stability import (
    ATTENTION_SPIKE,
    LAYERS,
    LOGIT_SPIKE,
    LOSS_SPIKE,
    RMS_SPIKE,
    STEPS,
    stability_scalars,
    write_stability_run,
)

from kgrad.logs.record import ProbeRecord
from kgrad.logs.writer import ProbeWriter

pytestmark = pytest.mark.slow  # a server subprocess, a browser: tens of seconds

SIZES = [(1400, 900), (1000, 700), (800, 600)]
RUNS = ["partial/kgrad", "plain/kgrad", "spiky/kgrad"]


def _write_runs(log_dir):
    write_stability_run(os.path.join(log_dir, "spiky"))
    writer = ProbeWriter(os.path.join(log_dir, "partial"))  # no weight shapes: the max over weights
    for step in range(STEPS):
        scalars = stability_scalars(step, spikes=(RMS_SPIKE,))
        kept = ("grad", "weight", "adam", "global")  # no logit_ nor attention_ tags
        writer.write(ProbeRecord(step, {k: v for k, v in scalars.items() if k.startswith(kept)}, {}))
    writer.close()
    writer = ProbeWriter(os.path.join(log_dir, "plain"))
    for step in range(0, STEPS, 10):
        writer.write(ProbeRecord(step, {"grad_norm/dense": 1.0, "weight_grad_norm/dense/kernel": 0.5}, {}))
    writer.close()


def _chromium_logging_errors():
    """Debian's chromium through Selenium, keeping the page's console (to find JS errors)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    if missing:
        pytest.skip(f"browser test needs Debian's chromium and chromium-driver; missing: {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@contextlib.contextmanager
def served_page(log_dir, runs, tmp_path_factory, size, ready):
    """The kgrad tab of a TensorBoard serving ``log_dir`` (once it lists ``runs``), in chromium at
    ``size``, after the JavaScript expression ``ready``; marked to tell a reload."""
    stderr_path = tmp_path_factory.mktemp("tensorboard") / "stderr.txt"
    with tensorboard_process(log_dir, stderr_path) as (process, port):
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"tensorboard exited:\n{stderr_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/kgrad/runs") as answer:
                    if json.loads(answer.read())["runs"] == runs:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"runs not served in 120 s:\n{stderr_path.read_text()[-3000:]}")
            time.sleep(0.5)
        driver = _chromium_logging_errors()
        try:
            driver.set_window_size(*size)
            driver.get(f"http://127.0.0.1:{port}/#kgrad")
            driver.switch_to.frame(wait_for(driver, "document.querySelector('iframe')"))
            wait_for(driver, ready)
            driver.execute_script("window.kgradTestMarker = 'no reload'")
            yield driver
        finally:
            driver.quit()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("stability_tab")
    _write_runs(str(log_dir))
    ready = "document.querySelector('.body[data-state=ready] .stability')"
    with served_page(log_dir, RUNS, tmp_path_factory, SIZES[0], ready) as driver:
        yield driver


def _resize(driver, width, height):
    driver.set_window_size(width, height)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not driver.execute_script(
        "const b = document.querySelector('.body');"
        "return b.dataset.state === 'ready' && b.dataset.layoutWidth === String(b.clientWidth)"
    ):
        time.sleep(0.2)
    time.sleep(0.3)  # past app.js' 100 ms wait for the end of a resize
    assert driver.execute_script("return window.kgradTestMarker") == "no reload"


_GEOMETRY = """
const box = (e) => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
const centre = (e) => {
  const b = e.getBoundingClientRect(); return [(b.left + b.right) / 2, (b.top + b.bottom) / 2];
};
const view = (run) => document.querySelector(`.stability[data-run="${run}"]`);
const spiky = view('spiky/kgrad');
const canvas = spiky.querySelector('canvas.stability-canvas');
const svgs = Object.fromEntries(
  [...spiky.querySelectorAll('svg.chart')].map((s) => [s.dataset.part, box(s)]));
return {
  viewport: document.documentElement.clientWidth,
  scrollWidth: document.documentElement.scrollWidth,
  canvas: {box: box(canvas), layers: Number(canvas.dataset.layers), steps: Number(canvas.dataset.steps)},
  labels: [...spiky.querySelectorAll('.row-label')].map((l) => l.dataset.layer),
  rings: [...spiky.querySelectorAll('.spike-cell')].map((r) => [r.dataset.layer, Number(r.dataset.step),
    centre(r), r.classList.contains('leader')]),
  marks: [...spiky.querySelectorAll('circle.spike-mark')].map((m) => [m.dataset.part, m.dataset.line,
    Number(m.dataset.step), centre(m), m.classList.contains('leader')]),
  svgs,
  lossLines: [...spiky.querySelectorAll('.loss-spike-line')].map((l) => [Number(l.dataset.step), box(l)]),
  lossList: [...spiky.querySelectorAll('.loss-spikes li')].map((li) => [Number(li.dataset.step),
    [...li.querySelectorAll('.lead')].map((s) => [s.dataset.layer, s.dataset.signal,
      Number(s.dataset.step)])]),
  inside: [...document.querySelectorAll('.stability')].map((v) => [v.dataset.run, box(v.closest('section')),
    [...v.querySelectorAll('*')].filter((e) => e.getClientRects().length).map((e) =>
      [e.tagName + '.' + e.getAttribute('class'), box(e), e.scrollWidth, e.clientWidth,
       getComputedStyle(e).overflowX !== 'visible'])]),
  hints: Object.fromEntries(['plain/kgrad', 'partial/kgrad'].map((run) =>
    [run, [...view(run).querySelectorAll('p.hint')].map((p) => p.textContent)])),
  legends: [...document.querySelectorAll('.stability-legend .legend-title')].map((t) => t.textContent),
  ticks: [...spiky.querySelectorAll('.stability-axis .tick')].map((t) => [Number(t.textContent), centre(t)]),
};
"""


def _column_x(canvas_box, column, steps=STEPS):
    return canvas_box[0] + (column + 0.5) / steps * (canvas_box[2] - canvas_box[0])


def _check(geometry):
    assert geometry["scrollWidth"] <= geometry["viewport"], "the page scrolls sideways"
    canvas = geometry["canvas"]
    assert (canvas["layers"], canvas["steps"]) == (len(LAYERS), STEPS)
    assert geometry["labels"] == list(LAYERS)
    near = lambda a, b: abs(a - b) <= 1.0  # noqa: E731
    # Every ring on its step's column (step = column: one probe a step from 0), and its layer's row.
    ((layer, step, (x, y), leader),) = geometry["rings"]
    assert (layer, step, leader) == ("dense_2", RMS_SPIKE[1], True)
    assert near(x, _column_x(canvas["box"], step))
    row_px = (canvas["box"][3] - canvas["box"][1]) / len(LAYERS)
    assert canvas["box"][1] + 2 * row_px <= y <= canvas["box"][1] + 3 * row_px
    marks = {(part, step): (centre, leader) for part, _, step, centre, leader in geometry["marks"]}
    planted = {("logits", LOGIT_SPIKE[1]), ("attention", ATTENTION_SPIKE[1]), ("loss", LOSS_SPIKE[1])}
    assert set(marks) == planted
    for (part, step), ((x, y), leader) in marks.items():
        assert near(x, _column_x(canvas["box"], step)), (part, step)
        svg = geometry["svgs"][part]
        assert svg[1] <= y <= svg[3] and near(svg[0], canvas["box"][0]) and near(svg[2], canvas["box"][2])
        assert leader == (part != "loss")  # the max logit and the attention max moved first
    ((step, line),) = geometry["lossLines"]
    assert step == LOSS_SPIKE[1] and near(line[0], _column_x(canvas["box"], step))
    assert line[1] <= canvas["box"][1] and line[3] >= geometry["svgs"]["loss"][3]  # down the whole view
    leaders = [["dense_2", "adam_rms", 44], ["block/mha", "attention logit max", 45],
               ["output", "max logit", 46]]
    assert geometry["lossList"] == [[48, leaders]]
    for tick, (x, _) in geometry["ticks"]:
        assert near(x, _column_x(canvas["box"], tick)), tick
    # Nothing clipped: every element of each view inside its run's column, no text cut off.
    for run, column, elements in geometry["inside"]:
        for name, element, scroll, client, clips in elements:
            # An axis' end label is centred on its step, as the tab's heatmap axis: it may stand
            # out of the column a few pixels, into the gap, never out of the window.
            edges = [0, geometry["viewport"]] if name == "SPAN.tick" else [column[0], column[2]]
            assert edges[0] - 0.5 <= element[0] and element[2] <= edges[1] + 0.5, (run, name, element, column)
            if clips:  # a box that hides what overflows it hides nothing
                assert scroll <= client + 1, (run, name, scroll, client)
    hint = 'instruments=["optimizer", "logits", "attention"]'
    assert len(geometry["hints"]["plain/kgrad"]) == 1 and hint in geometry["hints"]["plain/kgrad"][0]
    partial = geometry["hints"]["partial/kgrad"]
    missing = 'max logits (instruments=["logits"]), attention maxima (instruments=["attention"])'
    assert f"Not logged: {missing}." in partial
    assert len(geometry["legends"]) == 2
    assert any("RMS of g/(√v̂+ε) over the elements" in text for text in geometry["legends"])
    assert any("max over the layer's logged weights" in text for text in geometry["legends"])


def _screenshot(driver, name):
    folder = os.environ.get("KGRAD_TAB_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        for run in RUNS:  # each run's view, scrolled to
            driver.execute_script(
                f"document.querySelector('.stability[data-run=\"{run}\"]').closest('section')"
                ".querySelector('h3:last-of-type').scrollIntoView({block: 'start'})"
            )
            driver.save_screenshot(os.path.join(folder, f"{name}_{run.split('/')[0]}.png"))


def test_stability_view_at_three_sizes_with_resizes(page):
    canvas_widths = set()
    for width, height in SIZES:  # 1400 first, then resized twice without a reload
        _resize(page, width, height)
        geometry = page.execute_script(_GEOMETRY)
        _screenshot(page, f"stability_{width}x{height}")
        _check(geometry)
        canvas_widths.add(round(geometry["canvas"]["box"][2] - geometry["canvas"]["box"][0]))
    assert len(canvas_widths) == 3  # drawn again for each width
    _hover_shows_the_layers_adam_rms(page, "dense_2", RMS_SPIKE[1])
    errors = [entry for entry in page.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors
    # The check above can fail: an error the page logs is in what it reads.
    page.execute_script("console.error('kgrad test: the console is read')")
    assert any("the console is read" in entry["message"] for entry in page.get_log("browser"))


def _hover_shows_the_layers_adam_rms(driver, layer, step):
    """The tooltip of a cell: its layer, step and the RMS over the layer's weights, from the logged values."""
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = driver.find_element("css selector", '.stability[data-run="spiky/kgrad"] canvas.stability-canvas')
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    width, height = driver.execute_script(
        "const b = arguments[0].getBoundingClientRect(); return [b.width, b.height]", canvas
    )
    row = LAYERS.index(layer)
    dx = (step + 0.5) / STEPS * width - width / 2
    dy = (row + 0.5) / len(LAYERS) * height - height / 2
    ActionChains(driver).move_to_element_with_offset(canvas, round(dx), round(dy)).perform()
    wait_for(driver, f"document.querySelector('.tooltip').dataset.step === '{step}'")
    tip = driver.find_element("css selector", ".tooltip")
    scalars = stability_scalars(step)
    kernel, bias = scalars[f"adam_rms/{layer}/kernel"], scalars[f"adam_rms/{layer}/bias"]
    expected = ((64 * kernel**2 + 8 * bias**2) / 72) ** 0.5  # 64 kernel and 8 bias elements
    assert tip.get_attribute("data-layer") == layer
    assert float(tip.get_attribute("data-value")) == pytest.approx(expected, rel=1e-5)
    assert tip.find_element("css selector", ".tip-value").text.startswith("adam_rms = ")


def test_the_html_report_draws_the_view_from_disk(tmp_path):
    import kgrad

    write_stability_run(str(tmp_path / "logs" / "spiky"))
    kgrad.write_html_report(tmp_path / "logs", tmp_path / "report.html")
    driver = _chromium_logging_errors()
    try:
        driver.get((tmp_path / "report.html").as_uri())
        wait_for(driver, "document.querySelector('.body[data-state=ready] .stability-canvas')")
        drawn = driver.execute_script(
            "const v = document.querySelector('.stability'), c = v.querySelector('canvas.stability-canvas');"
            "return [Number(c.dataset.layers), Number(c.dataset.steps),"
            " [...v.querySelectorAll('.spike-cell, circle.spike-mark')].map((m) => Number(m.dataset.step))]"
        )
        planted = [RMS_SPIKE[1], ATTENTION_SPIKE[1], LOGIT_SPIKE[1], LOSS_SPIKE[1]]
        assert drawn[:2] == [len(LAYERS), STEPS] and sorted(drawn[2]) == sorted(planted)
        assert not [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    finally:
        driver.quit()
