"""The histogram panel of the HTML report (the tab's code): log-magnitude and linear histograms side by side.

A run written with ``histogram_buckets="linear"`` stands for the logs of
earlier versions; it still shows, on its own linear axis, beside a run of
log-magnitude histograms on a symmetric log axis. Checked at two window sizes:
the kinds, the axis labels and where the step's buckets are drawn.
"""

import math
import subprocess
import sys

import keras
import numpy as np
import pytest
from test_dashboard_logs import headless_chromium, wait_for

import kgrad
from kgrad.dashboard import views
from kgrad.dashboard.events import find_runs, read_run


def _view(log_dir, run):
    return views.RunView(run, read_run(find_runs(str(log_dir))[run]))


def _fit(log_dir, histogram_buckets, sample_weight=1.0, optimizer="sgd"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(6, activation="sigmoid", name="hidden"),
        keras.layers.Dense(1, name="out"),
    ])
    model.compile(optimizer, "mse")
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    probe = kgrad.GradientProbe(log_dir, every_n_steps=1, histogram_buckets=histogram_buckets)
    model.fit(x, np.ones((16, 1)), sample_weight=np.full(16, sample_weight, "float32"), batch_size=4,
              epochs=1, verbose=0, callbacks=[probe])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("histogram_panel")
    _fit(log_dir / "linear_run", "linear")
    _fit(log_dir / "log_run", "log")
    html = log_dir / "report.html"
    command = [sys.executable, "-m", "kgrad.cli", "report", str(log_dir), "--html", str(html)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    return log_dir, html


def test_the_view_says_the_kind_and_a_range_for_it(report):
    log_dir, _ = report
    log = _view(log_dir, "log_run/kgrad").histogram("weight_grad_hist/hidden/kernel")
    linear = _view(log_dir, "linear_run/kgrad").histogram("weight_grad_hist/hidden/kernel")
    assert (log["kind"], linear["kind"]) == ("log", "linear")
    # Shared by every weight gradient's histogram of the run: the magnitudes of their non-empty buckets.
    histograms = kgrad.read_logs(log_dir)["log_run/kgrad"]["histograms"]
    magnitudes = []
    for tag in [tag for tag in histograms if tag.startswith("weight_grad_hist/")]:
        values = histograms[tag].values
        sides = np.delete(values, values.shape[1] // 2, axis=1)  # without the zero bucket
        magnitudes.extend(np.abs(sides[..., :2])[sides[..., 2] > 0])
    assert log["range"] == pytest.approx([np.min(magnitudes), np.max(magnitudes)])
    assert linear["range"][0] < 0 < linear["range"][1]


def _open_histograms(driver, html, run, window):
    """The report at ``window`` size, its first layer's histograms opened from ``run``'s heatmap."""
    from selenium.webdriver.common.action_chains import ActionChains

    driver.set_window_size(*window)
    driver.get(html.as_uri())
    wait_for(driver, "document.querySelector('.body[data-state=ready]')")
    canvas = driver.find_element("css selector", f'section.run-column[data-run="{run}"] canvas')
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    offset = round(-canvas.size["height"] / 4)  # the first layer's row
    ActionChains(driver).move_to_element_with_offset(canvas, 0, offset).click().perform()
    wait_for(driver, "document.querySelectorAll('figure.histogram').length == 2")


def _symmetric_log_position(value, smallest, largest):
    """Where a value sits across a log-magnitude panel, in [0, 1]: 0 in the middle, ±largest at the ends."""
    zero_half = 0.25  # half of the zero bucket's width, in decades
    half = zero_half + math.log10(largest / smallest)
    if value == 0:
        return 0.5
    distance = zero_half + max(0.0, math.log10(abs(value) / smallest))
    return 0.5 + math.copysign(distance, value) / (2 * half)


@pytest.mark.parametrize("window", [(1400, 1000), (640, 900)])
def test_log_and_linear_histograms_are_drawn_where_their_buckets_are(report, window):
    log_dir, html = report
    driver = headless_chromium()
    try:
        _open_histograms(driver, html, "log_run/kgrad", window)
        figures = driver.execute_script("""
            return [...document.querySelectorAll('figure.histogram')].map((f) => {
              const canvas = f.querySelector('canvas');
              const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, 1).data;
              const drawn = [];
              for (let c = 0; c < canvas.width; c++) {
                if (pixels[4 * c] !== 250 || pixels[4 * c + 2] !== 250) drawn.push(c);
              }
              return {run: f.dataset.run, kind: f.dataset.kind, width: canvas.width, drawn,
                      labels: [...f.querySelectorAll('.histogram-axis span')]
                        .map((s) => [s.textContent, s.style.left]),
                      right: f.getBoundingClientRect().right};
            });""")
        by_run = {figure["run"]: figure for figure in figures}
        assert by_run["log_run/kgrad"]["kind"] == "log" and by_run["linear_run/kgrad"]["kind"] == "linear"
        assert all(figure["right"] <= window[0] for figure in figures)  # nothing off the window
        log = by_run["log_run/kgrad"]
        labels = dict(log["labels"])
        assert labels["0"] == "50%"
        # Its range ends inside the fixed edges: no end is open (see the test below).
        assert not any(text.startswith(("≥", "≤")) for text, _ in log["labels"])
        decades = [text for text, _ in log["labels"] if text.startswith("1e")]
        assert decades and all(f"−{text}" in labels for text in decades)  # symmetric about 0
        # The first step's buckets, placed by the symmetric log-magnitude formula.
        tag = driver.execute_script("return document.querySelector('figure.histogram').dataset.tag")
        first = kgrad.read_logs(log_dir)["log_run/kgrad"]["histograms"][tag].values[0]
        view = _view(log_dir, "log_run/kgrad").histogram(tag)
        smallest, largest = view["range"]
        expected = set()
        for left, right, count in first:
            if count > 0:
                width = log["width"]
                start = math.floor(_symmetric_log_position(left, smallest, largest) * width)
                end = max(start, math.ceil(_symmetric_log_position(right, smallest, largest) * width) - 1)
                expected.update(range(max(0, start), min(width - 1, end) + 1))
        assert set(log["drawn"]) == expected
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def beyond_the_edges(tmp_path_factory):
    """A report of two log-magnitude runs: gradients ×1e20 (beyond 1e4) and ×1e-20 (below 1e-12)."""
    log_dir = tmp_path_factory.mktemp("beyond_edges")
    # A learning rate of 0: every step's gradients are the first's (finite, of the same size).
    _fit(log_dir / "huge", "log", sample_weight=1e20, optimizer=keras.optimizers.SGD(0.0))
    _fit(log_dir / "tiny", "log", sample_weight=1e-20, optimizer=keras.optimizers.SGD(0.0))
    html = log_dir / "report.html"
    command = [sys.executable, "-m", "kgrad.cli", "report", str(log_dir), "--html", str(html)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    # Exit 1: layers flagged (exploding in one run, vanishing in the other), as they should be.
    assert done.returncode == 1 and "exploding" in done.stdout and html.exists(), done.stderr[-2000:]
    return log_dir, html


@pytest.mark.parametrize("window", [(1400, 1000), (640, 900)])
def test_an_axis_that_reaches_the_fixed_edges_says_its_ends_hold_everything_beyond(beyond_the_edges, window):
    """Magnitudes beyond 1e4 are counted in the outermost bucket, [10**3.5, 1e4]: drawn there, the
    axis must not say they are at most 1e4 (nor the innermost bucket's that they are at least 1e-12)."""
    log_dir, html = beyond_the_edges
    view = _view(log_dir, "huge/kgrad").histogram("weight_grad_hist/hidden/kernel")
    assert view["outermost"] == pytest.approx([1e-12, 1e4])
    assert view["range"][1] == pytest.approx(1e4)  # the gradients are ~1e19: all in the last bucket
    driver = headless_chromium()
    try:
        _open_histograms(driver, html, "huge/kgrad", window)
        ends, hint = driver.execute_script("""
            const figure = document.querySelector('figure.histogram');
            const spans = [...figure.querySelectorAll('.histogram-axis span')];
            return [[spans.find((s) => s.className === 'low').textContent,
                     spans.find((s) => s.className === 'high').textContent],
                    [...document.querySelectorAll('p.hint')].map((p) => p.textContent).join(' ')];""")
        assert ends == ["≤−1.0e+4", "≥1.0e+4"]
        assert "the outermost buckets also count every magnitude above 1.0e+4" in hint
        assert "the innermost every non-zero one below 1.0e-12" in hint
        driver.save_screenshot(str(log_dir / f"beyond_{window[0]}.png"))
    finally:
        driver.quit()
