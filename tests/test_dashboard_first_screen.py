"""The kgrad tab's first screen, a row label's click and the tooltip after a redraw, in a browser.

In a real ``tensorboard --logdir`` server on the demo's logs (with the guard and
XSS runs of `test_dashboard_logs`) and headless chromium, at 1400x900, 1000x700
and 800x600: before any heatmap the page says which runs have flagged layers
and how many, as ``kgrad.health_report`` counts them; at 1000 and 800 px, where
the runs stack and ``sigmoid_deep`` starts below the fold, a click on its line
brings it into view. A row's label opens its layer's histograms as its cells do.
A redraw under a pointer that did not move (a colour chosen by keyboard) shows
the value now under it, as a fresh hover does. Screenshots go to
``KGRAD_TAB_SCREENSHOTS`` when set.
"""

import os
import pathlib
import re
import time

import pytest
from test_dashboard_logs import dashboard_logs, headless_chromium, logs, wait_for  # noqa: F401  (fixtures)
from test_dashboard_tab import server  # noqa: F401  (fixture)

import kgrad

pytestmark = pytest.mark.slow  # a server subprocess, a browser: tens of seconds

SIZES = [(1400, 900), (1000, 700), (800, 600)]


@pytest.fixture(scope="module")
def driver():
    driver = headless_chromium()
    try:
        yield driver
    finally:
        driver.quit()


def _open(driver, port, width, height):
    driver.switch_to.default_content()
    driver.set_window_size(width, height)
    driver.get("about:blank")  # a fresh page, scrolled to its top (the same URL would not reload)
    driver.get(f"http://127.0.0.1:{port}/#kgrad")
    driver.switch_to.frame(wait_for(driver, "document.querySelector('iframe')"))
    wait_for(driver, "document.querySelector('.body[data-state=ready]')")


def _screenshot(driver, name):
    folder = os.environ.get("KGRAD_TAB_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        driver.save_screenshot(os.path.join(folder, f"{name}.png"))


def _expected_lines(logs):  # noqa: F811
    """``{run: text}`` of the summary, from `kgrad.health_report` (its layers' flags counted here)."""
    expected = {}
    for run in kgrad.health_report(logs):
        counts = {}
        for layer in run.layers:
            for flag in layer.flags:
                counts[flag] = counts.get(flag, 0) + 1
        parts = [f"{count} layer{'s' if count != 1 else ''} {flag.upper()}" for flag, count in counts.items()]
        expected[run.run] = f"{run.run}: " + (", ".join(parts) if parts else "no layer flagged")
    return expected


_FIRST_SCREEN = """
const box = (e) => e.getBoundingClientRect();
const summary = document.querySelector('[data-role=flag-summary]');
const sigmoid = document.querySelector('section.run-column[data-run="sigmoid_deep/kgrad"]');
return {
  height: window.innerHeight,
  summary: [box(summary).top, box(summary).bottom],
  lines: [...summary.querySelectorAll('.flag-line')].map((b) => [b.dataset.run, b.textContent,
    b.classList.contains('flagged'), box(b).bottom]),
  firstHeatmap: Math.min(...[...document.querySelectorAll('canvas.heatmap-canvas')].map((c) => box(c).top)),
  sigmoidTop: box(sigmoid).top,
};
"""


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
def test_the_first_screen_says_which_runs_have_flagged_layers(driver, server, logs, size):  # noqa: F811
    _open(driver, server, *size)
    screen = driver.execute_script(_FIRST_SCREEN)
    _screenshot(driver, f"first_screen_{size[0]}x{size[1]}")
    expected = _expected_lines(logs)
    lines = {run: text.removeprefix("⚠ ") for run, text, _, _ in screen["lines"]}
    assert lines == expected
    assert "VANISHING" in lines["sigmoid_deep/kgrad"]
    # Flagged runs first, marked; the whole summary on the first screen, above every heatmap.
    flagged = [flag for _, _, flag, _ in screen["lines"]]
    assert flagged == sorted(flagged, reverse=True) and any(flagged)
    assert all(flag == ("no layer flagged" not in text) for _, text, flag, _ in screen["lines"])
    assert 0 <= screen["summary"][0] and screen["summary"][1] <= screen["height"]
    assert screen["summary"][1] <= screen["firstHeatmap"]
    if size[0] <= 1100:  # stacked: sigmoid_deep starts below the fold, and its line leads there
        assert screen["sigmoidTop"] > screen["height"]
        driver.find_element("css selector", '.flag-line[data-run="sigmoid_deep/kgrad"]').click()
        wait_for(driver, "document.querySelector('section.run-column[data-run=\"sigmoid_deep/kgrad\"]')"
                         ".getBoundingClientRect().top < 5")
        top = driver.execute_script(_FIRST_SCREEN)["sigmoidTop"]
        assert -1 <= top < screen["height"] / 2
        _screenshot(driver, f"first_screen_{size[0]}x{size[1]}_after_click")


def test_a_row_label_opens_its_layers_histograms(driver, server):  # noqa: F811
    from selenium.webdriver.common.keys import Keys

    _open(driver, server, 1000, 700)
    label = driver.find_element(
        "css selector", 'section.run-column[data-run="sigmoid_deep/kgrad"] .row-label[data-layer="hidden_1"]')
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", label)
    label.click()
    wait_for(driver, "document.querySelector('.histograms[data-layer=\"hidden_1\"]')")
    assert driver.execute_script("return document.querySelectorAll('.histograms figure').length") >= 2
    _screenshot(driver, "label_click_1000x700")
    # By keyboard too: the label is a button in the tab order.
    other = driver.find_element(
        "css selector", 'section.run-column[data-run="relu_deep/kgrad"] .row-label[data-layer="output"]')
    assert other.get_attribute("role") == "button" and other.get_attribute("tabindex") == "0"
    other.send_keys(Keys.ENTER)
    wait_for(driver, "document.querySelector('.histograms[data-layer=\"output\"]')")


def test_the_tooltip_follows_a_redraw_under_a_still_pointer(driver, server):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    _open(driver, server, 1400, 900)
    canvas_selector = 'section.run-column[data-run="relu_deep/kgrad"] canvas.heatmap-canvas'
    canvas = driver.find_element("css selector", canvas_selector)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    ActionChains(driver).move_to_element_with_offset(canvas, 5, 0).perform()
    wait_for(driver, "!document.querySelector('.tooltip').hidden")
    tip = lambda: driver.execute_script(  # noqa: E731
        "const t = document.querySelector('.tooltip');"
        "return [t.hidden, t.dataset.run, t.dataset.layer, t.dataset.step, t.dataset.value,"
        " t.querySelector('.tip-value') && t.querySelector('.tip-value').textContent]")
    before = tip()
    # Another colour, chosen by keyboard: the view redraws under the pointer, which does not move.
    select = driver.find_element("css selector", "select[data-role=quantity]")
    colour = select.get_attribute("value")
    driver.execute_script("arguments[0].focus()", select)
    select.send_keys(Keys.ARROW_DOWN)
    wait_for(driver, f"document.querySelector('select[data-role=quantity]').value !== '{colour}'"
                     " && document.querySelector('.body').dataset.state === 'ready'")
    time.sleep(0.3)
    after = tip()
    assert after[1:4] == before[1:4]  # the same cell: run, layer, step
    assert after[5].split(" = ")[0] != before[5].split(" = ")[0]  # under the new colour's name
    # What a fresh hover at the same place shows.
    ActionChains(driver).move_by_offset(1, 0).move_by_offset(-1, 0).perform()
    time.sleep(0.3)
    assert tip() == after
    _screenshot(driver, "tooltip_after_redraw")


def test_the_readme_says_the_side_each_demo_run_is_drawn_on(driver, server):  # noqa: F811
    _open(driver, server, 1400, 900)
    for run in ("guard/kgrad", "xss/kgrad"):  # the demo's runs alone, as the README shows them
        driver.find_element("css selector", f'input[data-run="{run}"]').click()
        wait_for(driver, f"!document.querySelector('section.run-column[data-run=\"{run}\"]')"
                         " && document.querySelector('.body').dataset.state === 'ready'")
    left = driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('section.run-column')]"
        ".map((c) => [c.dataset.run, c.getBoundingClientRect().left]))")
    sides = {"sigmoid": "left" if left["sigmoid_deep/kgrad"] < left["relu_deep/kgrad"] else "right"}
    sides["ReLU"] = "right" if sides["sigmoid"] == "left" else "left"
    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    for model, side in sides.items():
        (said,) = re.findall(rf"{model} MLP \((left|right)\)", readme)
        assert said == side, f"the README puts the {model} MLP on the {said}; the tab draws it on the {side}"
