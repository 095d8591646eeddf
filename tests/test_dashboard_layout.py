"""The kgrad tab as a person uses it: three window sizes, resizes, a click, a colour change.

In a real ``tensorboard --logdir`` server and headless chromium (as
``test_dashboard_tab``), at 1400x900, 1000x700 and 800x600, resized without
a reload. What is checked is geometry the person sees: heatmaps and their
step axes apart, runs stacked when they do not fit side by side, the flags
never clipped, the histograms of a clicked cell inside the window, and a
logged NaN drawn in the NaN/Inf colour. With ``KGRAD_TAB_SCREENSHOTS=DIR``
set, each check saves a screenshot there, to look at.
"""

import os
import time

import numpy as np
import pytest
from test_dashboard_logs import (  # noqa: F401  (fixtures)
    GUARD_TRIP_STEP,
    dashboard_logs,
    headless_chromium,
    logs,
    wait_for,
)
from test_dashboard_tab import server  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow  # a server subprocess, a browser: tens of seconds

SIZES = [(1400, 900), (1000, 700), (800, 600)]
NONFINITE_RGB = [229, 57, 53]  # common.js
MISSING_RGB = [225, 225, 225]  # common.js: "not logged"


@pytest.fixture(scope="module")
def page(server):  # noqa: F811
    driver = headless_chromium()
    try:
        driver.set_window_size(*SIZES[0])
        driver.get(f"http://127.0.0.1:{server}/#kgrad")
        driver.switch_to.frame(wait_for(driver, "document.querySelector('iframe')"))
        wait_for(driver, "document.querySelector('.body[data-state=ready]')")
        # Gone if the page reloads: every resize below must redraw in place.
        driver.execute_script("window.kgradTestMarker = 'no reload'")
        yield driver
    finally:
        driver.quit()


def _screenshot(driver, name):
    folder = os.environ.get("KGRAD_TAB_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        driver.save_screenshot(os.path.join(folder, f"{name}.png"))


def _resize(driver, width, height):
    driver.set_window_size(width, height)
    # Until laid out again for the new width (app.js writes the width it laid out for);
    # the checks that follow are on what is drawn, whether or not that came.
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
const all = (selector, root = document) => [...root.querySelectorAll(selector)];
return {
  viewport: [document.documentElement.clientWidth, window.innerHeight],
  scrollWidth: document.documentElement.scrollWidth,
  columns: all('section.run-column').map((c) => ({
    run: c.dataset.run, box: box(c), heatmap: box(c.querySelector('.heatmap')),
    canvas: box(c.querySelector('canvas.heatmap-canvas')), canvasWidth: c.querySelector('canvas').style.width,
    ticks: all('.step-axis .tick', c).map((t) => [t.textContent, box(t)]),
  })),
  flags: all('td.col-flags').map((td) => ({
    text: td.textContent, scroll: td.scrollWidth, client: td.clientWidth, box: box(td),
    wrap: box(td.closest('.table-wrap')),
  })),
  wraps: all('.table-wrap').map((w) => [w.scrollWidth, w.clientWidth]),
  badges: all('.row-label .badge').map((b) => ({text: b.textContent, box: box(b), label: box(b.parentElement),
    scroll: b.scrollWidth, client: b.clientWidth})),
};
"""


def _overlap(a, b):
    """Whether two [left, top, right, bottom] boxes share any area (touching edges do not)."""
    return min(a[2], b[2]) - max(a[0], b[0]) > 0.5 and min(a[3], b[3]) - max(a[1], b[1]) > 0.5


def _inside(inner, outer):
    return all(inner[k] >= outer[k] - 0.5 for k in (0, 1)) and all(inner[k] <= outer[k] + 0.5 for k in (2, 3))


def _check_layout(geometry):
    width = geometry["viewport"][0]
    assert geometry["scrollWidth"] <= width, "the page scrolls sideways"
    columns = geometry["columns"]
    assert len(columns) == 4
    for index, column in enumerate(columns):
        assert column["canvas"][2] <= column["box"][2] + 0.5, (column["run"], "heatmap wider than its column")
        assert column["box"][2] <= width + 0.5, column["run"]
        for other in columns[index + 1 :]:
            assert not _overlap(column["heatmap"], other["heatmap"]), (column["run"], other["run"])
            assert not _overlap(column["box"], other["box"]), (column["run"], other["run"])
    # Step ticks apart, within a heatmap and across heatmaps ("770 01020" was two axes run together).
    ticks = [(column["run"], text, tick) for column in columns for text, tick in column["ticks"]]
    for index, (run, text, tick) in enumerate(ticks):
        for other_run, other_text, other in ticks[index + 1 :]:
            assert not _overlap(tick, other), (run, text, other_run, other_text)
    # The flags column: whole, inside the table's box, nothing to scroll to.
    assert geometry["flags"] and any("VANISHING since step" in flag["text"] for flag in geometry["flags"])
    for flag in geometry["flags"]:
        assert flag["scroll"] <= flag["client"], flag
        assert _inside(flag["box"], flag["wrap"]) and flag["box"][2] <= width, flag
    assert all(scroll <= client for scroll, client in geometry["wraps"]), geometry["wraps"]
    assert {badge["text"] for badge in geometry["badges"]} >= {"vanishing", "nonfinite"}
    for badge in geometry["badges"]:
        assert badge["scroll"] <= badge["client"] and _inside(badge["box"], badge["label"]), badge


def _rows_of(geometry):
    """Columns grouped by the row of the page they are on (by their top)."""
    tops = {}
    for column in geometry["columns"]:
        tops.setdefault(round(column["box"][1]), []).append(column["run"])
    return list(tops.values())


def test_layout_holds_at_three_sizes_and_resizes_without_reload(page):
    widths = {}
    # 1400 -> 1000 is the resize that overlapped the heatmaps; back up again at the end.
    for width, height in SIZES + SIZES[-2::-1]:
        _resize(page, width, height)
        geometry = page.execute_script(_GEOMETRY)
        _screenshot(page, f"layout_{width}x{height}")
        _check_layout(geometry)
        rows = _rows_of(geometry)
        assert all(len(row) == len(rows[0]) for row in rows[:-1]), rows
        if width == 1400:
            assert len(rows[0]) >= 2, rows  # room for runs side by side: they are
        if width == 800:
            assert rows == [[column["run"]] for column in geometry["columns"]]  # one above the other
        canvas_widths = {column["canvasWidth"] for column in geometry["columns"]}
        assert widths.setdefault((width, height), canvas_widths) == canvas_widths  # same size, same drawing
    assert widths[(1400, 900)] != widths[(800, 600)]  # drawn again for the width


def _cell_offset(driver, canvas, row, column):
    layers, steps = int(canvas.get_attribute("data-layers")), int(canvas.get_attribute("data-steps"))
    width, height = driver.execute_script(
        "const b = arguments[0].getBoundingClientRect(); return [b.width, b.height]", canvas
    )
    return (column + 0.5) / steps * width - width / 2, (row + 0.5) / layers * height - height / 2


def _canvas(driver, run):
    return driver.find_element("css selector", f'section.run-column[data-run="{run}"] canvas.heatmap-canvas')


def _click_cell(driver, run, row, column):
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = _canvas(driver, run)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    dx, dy = _cell_offset(driver, canvas, row, column)
    ActionChains(driver).move_to_element_with_offset(canvas, round(dx), round(dy)).click().perform()


def _histogram_tags(driver, layer):
    return driver.execute_script(
        "return [...document.querySelectorAll(`.histograms[data-layer='${arguments[0]}'] figure.histogram`)]"
        ".map((f) => [f.dataset.run, f.dataset.tag])",
        layer,
    )


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
def test_a_click_brings_the_histograms_into_view(page, size):
    _resize(page, *size)
    page.execute_script("window.scrollTo(0, 0); document.querySelector('.detail').replaceChildren()")
    _click_cell(page, "relu_deep/kgrad", 2, 5)
    wait_for(
        page, "document.querySelectorAll('.histograms[data-layer=hidden_3] figure.histogram').length >= 2"
    )
    page.execute_script("return new Promise((done) => requestAnimationFrame(() => done()))")
    _screenshot(page, f"histograms_{size[0]}x{size[1]}")
    panel, figures, view = page.execute_script(
        "const box = (e) => { const b = e.getBoundingClientRect();"
        " return [b.left, b.top, b.right, b.bottom]; };"
        "return [box(document.querySelector('.detail')),"
        " [...document.querySelectorAll('figure.histogram')].map(box),"
        " [document.documentElement.clientWidth, window.innerHeight]]"
    )
    assert panel[1] >= -0.5 and panel[3] <= view[1] + 0.5, (panel, view)  # all of it, in the frame
    assert all(_inside(figure, [0, 0, *view]) for figure in figures), (figures, view)
    # ... and the frame inside TensorBoard's window.
    page.switch_to.default_content()
    try:
        frame, window = page.execute_script(
            "const b = document.querySelector('iframe').getBoundingClientRect();"
            "return [[b.left, b.top, b.right, b.bottom], [window.innerWidth, window.innerHeight]]"
        )
    finally:
        page.switch_to.frame(page.find_element("css selector", "iframe"))
    assert _inside(frame, [0, 0, *window]), (frame, window)


def test_the_histograms_follow_the_colour_choice(page):
    from selenium.webdriver.support.ui import Select

    _resize(page, 1000, 700)
    _click_cell(page, "sigmoid_deep/kgrad", 0, 3)
    runs = {"relu_deep/kgrad", "sigmoid_deep/kgrad"}
    expected = {  # the colour's histograms: dJ/dw's of the kernel, dJ/d(activation)'s of the layer
        "grad": {(run, "grad_hist/hidden_1") for run in runs},
        "weight_grad": {(run, "weight_grad_hist/hidden_1/kernel") for run in runs},
    }
    wait_for(page, "document.querySelectorAll('.histograms[data-layer=hidden_1] figure').length >= 2")
    assert {tuple(pair) for pair in _histogram_tags(page, "hidden_1")} == expected["weight_grad"]
    for quantity in ("grad", "weight_grad"):
        Select(page.find_element("css selector", "select.quantity")).select_by_value(quantity)
        wait_for(
            page,
            "[...document.querySelectorAll('.histograms[data-layer=hidden_1] figure')]"
            f".every((f) => f.dataset.tag.startsWith('{quantity}_hist/'))",
        )
        assert {tuple(pair) for pair in _histogram_tags(page, "hidden_1")} == expected[quantity]
        _screenshot(page, f"colour_{quantity}")


def _pixel(driver, run, row, column):
    """The RGB drawn at the centre of a heatmap cell."""
    return driver.execute_script(
        "const c = arguments[0], steps = Number(c.dataset.steps), layers = Number(c.dataset.layers);"
        "const x = Math.floor(((arguments[2] + 0.5) / steps) * c.width);"
        "const y = Math.floor(((arguments[1] + 0.5) / layers) * c.height);"
        "return [...c.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3)];",
        _canvas(driver, run),
        row,
        column,
    )


def test_a_logged_nan_is_drawn_red_not_grey(page, logs):  # noqa: F811
    from selenium.webdriver.support.ui import Select

    Select(page.find_element("css selector", "select.quantity")).select_by_value("weight_grad")
    wait_for(page, "document.querySelector('.body').dataset.state === 'ready'")
    # The guard's run logged a NaN dJ/dw on the tripped step (the logs say so, not "nothing logged").
    norms = logs["guard/kgrad"]["scalars"]["weight_grad_norm/hidden/kernel"]
    steps = norms.steps.tolist()
    assert np.isnan(norms.values[steps.index(GUARD_TRIP_STEP)])
    assert np.isfinite(norms.values[steps.index(GUARD_TRIP_STEP - 1)])
    nan_column = steps.index(GUARD_TRIP_STEP)
    for row in (0, 1):  # hidden, out
        assert _pixel(page, "guard/kgrad", row, nan_column) == NONFINITE_RGB
        finite = _pixel(page, "guard/kgrad", row, nan_column - 1)
        assert finite not in (NONFINITE_RGB, MISSING_RGB), finite
    # The tooltip says so too.
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = _canvas(page, "guard/kgrad")
    page.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    dx, dy = _cell_offset(page, canvas, 0, nan_column)
    ActionChains(page).move_to_element_with_offset(canvas, round(dx), round(dy)).perform()
    wait_for(page, f"document.querySelector('.tooltip').dataset.step === '{GUARD_TRIP_STEP}'")
    assert page.find_element("css selector", ".tooltip .tip-value").text.endswith("= NaN/Inf")
    _screenshot(page, "nan_red")
