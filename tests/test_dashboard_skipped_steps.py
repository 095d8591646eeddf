"""The kgrad tab's stability view marks the steps a NonFiniteGuard skipped; its row labels follow its rows.

One run written with kgrad's own writer under the guard's tag contract
(tests/skipped_logs.py): layers in a forward order that is not alphabetical
(zeta, block/mha/query, block/mha/key, alpha), steps 18 and 27 skipped, a loss
spike at 30. In a real TensorBoard server and headless chromium at 1400x900,
then resized to 1000x700 and 700x600 without a reload: each row label sits on
its row and names the layer whose values the row draws (the tooltip of a cell
in that row), each skipped step has a band on its column and a line in the list
with its leading layers (a tie as a tie, the key bias not scored), nothing
scrolls sideways, and the page logs no JavaScript error. Screenshots go to
``KGRAD_TAB_SCREENSHOTS`` when set. The HTML report, opened from disk, shows
the same marks and list.
"""

import json
import os
import time
import urllib.request

import pytest
from skipped_logs import LAYERS, SKIPPED, STEPS, write_skipped_run
from tensorboard_process import tensorboard_process
from test_dashboard_logs import wait_for
from test_dashboard_stability_tab import _chromium_logging_errors, _resize

pytestmark = pytest.mark.slow  # a server subprocess, a browser: tens of seconds

SIZES = [(1400, 900), (1000, 700), (700, 600)]
RUN = "guarded/kgrad"

_GEOMETRY = """
const box = (e) => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
const view = document.querySelector('.stability');
const canvas = view.querySelector('canvas.stability-canvas');
return {
  viewport: document.documentElement.clientWidth,
  scrollWidth: document.documentElement.scrollWidth,
  canvas: box(canvas),
  labels: [...view.querySelectorAll('.row-label')].map((l) => [l.dataset.layer, l.textContent, box(l)]),
  bands: [...view.querySelectorAll('.skipped-step-line')].map((b) => [Number(b.dataset.step), box(b)]),
  list: [...view.querySelectorAll('.skipped-steps li')].map((li) => [Number(li.dataset.step),
    [...li.querySelectorAll('.skip-group')].map((g) => [...g.querySelectorAll('.skip-lead')].map(
      (s) => s.dataset.layer)),
    (li.querySelector('.not-scored') || {}).title || '', li.textContent]),
  leads: [...view.querySelectorAll('.loss-spikes .lead')].map((s) => [s.dataset.layer, s.textContent,
    Number(s.dataset.sigmas)]),
};
"""


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("skipped_tab")
    write_skipped_run(log_dir / "guarded" / "kgrad")
    stderr_path = tmp_path_factory.mktemp("tensorboard") / "stderr.txt"
    with tensorboard_process(log_dir, stderr_path) as (process, port):
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"tensorboard exited:\n{stderr_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/kgrad/runs") as answer:
                    if json.loads(answer.read())["runs"] == [RUN]:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"runs not served in 120 s:\n{stderr_path.read_text()[-3000:]}")
            time.sleep(0.5)
        driver = _chromium_logging_errors()
        try:
            driver.set_window_size(*SIZES[0])
            driver.get(f"http://127.0.0.1:{port}/#kgrad")
            driver.switch_to.frame(wait_for(driver, "document.querySelector('iframe')"))
            wait_for(driver, "document.querySelector('.body[data-state=ready] .stability .skipped-steps')")
            driver.execute_script("window.kgradTestMarker = 'no reload'")
            yield driver
        finally:
            driver.quit()


def _hovered_layer(driver, row):
    """The layer the tooltip names for a cell of ``row`` of the stability heatmap."""
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = driver.find_element("css selector", ".stability canvas.stability-canvas")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    width, height = driver.execute_script(
        "const b = arguments[0].getBoundingClientRect(); return [b.width, b.height]", canvas)
    step = 5
    dx = (step + 0.5) / STEPS * width - width / 2
    dy = (row + 0.5) / len(LAYERS) * height - height / 2
    ActionChains(driver).move_to_element_with_offset(canvas, round(dx), round(dy)).perform()
    wait_for(driver, f"document.querySelector('.tooltip') && document.querySelector('.tooltip').dataset.step === '{step}'"
             f" && document.querySelector('.tooltip').dataset.layer === document.querySelectorAll("
             f"'.stability .row-label')[{row}].dataset.layer")
    return driver.find_element("css selector", ".tooltip").get_attribute("data-layer")


def _check_marks_and_list(geometry):
    canvas = geometry["canvas"]
    bands = dict(geometry["bands"])
    assert sorted(bands) == list(SKIPPED)
    for step, band in bands.items():  # on its column (one probe a step from 0)
        centre = canvas[0] + (step + 0.5) / STEPS * (canvas[2] - canvas[0])
        assert abs((band[0] + band[2]) / 2 - centre) <= 1.5, (step, band, centre)
        assert band[1] <= canvas[1] and band[3] >= canvas[3]  # down the whole view
    (first, first_groups, first_why, first_text), (second, second_groups, _, _) = geometry["list"]
    assert (first, second) == SKIPPED
    assert first_groups == [["zeta", "alpha"], ["block/mha/query"]], first_text  # z 41 and 40.5: a tie
    assert "2 tied: " in first_text and "moved most" in first_text
    assert first_why.startswith("block/mha/key/bias: rounding noise") and "not scored: block/mha/key/bias" in first_text
    assert second_groups == [["alpha"]]


def test_skipped_steps_and_row_labels_at_three_sizes(page):
    for width, height in SIZES:
        _resize(page, width, height)
        geometry = page.execute_script(_GEOMETRY)
        folder = os.environ.get("KGRAD_TAB_SCREENSHOTS")
        if folder:
            os.makedirs(folder, exist_ok=True)
            page.execute_script("document.querySelector('.stability').scrollIntoView({block: 'start'})")
            page.save_screenshot(os.path.join(folder, f"skipped_{width}x{height}.png"))
        assert geometry["scrollWidth"] <= geometry["viewport"], "the page scrolls sideways"
        # The labels, top to bottom, are the rows in forward order (not alphabetical), each on its row.
        assert [layer for layer, _, _ in geometry["labels"]] == list(LAYERS)
        row_px = (geometry["canvas"][3] - geometry["canvas"][1]) / len(LAYERS)
        for row, (layer, text, label) in enumerate(geometry["labels"]):
            middle = (label[1] + label[3]) / 2
            assert geometry["canvas"][1] + row * row_px <= middle <= geometry["canvas"][1] + (row + 1) * row_px
            assert text.split("/")[-1] == layer.split("/")[-1] or "…" in text, (text, layer)
        _check_marks_and_list(geometry)
    # A row's cells are the layer its label names (the tooltip reads the row's data).
    for row, layer in enumerate(LAYERS):
        assert _hovered_layer(page, row) == layer
    errors = [entry for entry in page.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors


def test_the_html_report_shows_the_skipped_steps(tmp_path):
    import kgrad

    write_skipped_run(tmp_path / "logs" / "guarded" / "kgrad")
    kgrad.write_html_report(tmp_path / "logs", tmp_path / "report.html")
    driver = _chromium_logging_errors()
    try:
        driver.set_window_size(1000, 800)
        driver.get((tmp_path / "report.html").as_uri())
        wait_for(driver, "document.querySelector('.body[data-state=ready] .stability .skipped-steps')")
        geometry = driver.execute_script(_GEOMETRY)
        _check_marks_and_list(geometry)
        assert [layer for layer, _, _ in geometry["labels"]] == list(LAYERS)
        # The loss spike's leader with its size, as kgrad report computes it.
        (run,) = kgrad.health_report(kgrad.read_logs(tmp_path / "logs"))
        (lead,) = run.stability.loss_spikes[0].leaders
        ((layer, text, sigmas),) = geometry["leads"]
        assert (layer, sigmas) == ("alpha", pytest.approx(lead.sigmas, rel=1e-6))
        assert text == f"alpha adam_rms ({lead.sigmas:.0f}σ)"
        folder = os.environ.get("KGRAD_TAB_SCREENSHOTS")
        if folder:
            driver.execute_script("document.querySelector('.stability').scrollIntoView({block: 'start'})")
            driver.save_screenshot(os.path.join(folder, "skipped_html_report.png"))
        assert not [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    finally:
        driver.quit()
