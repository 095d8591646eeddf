"""The kgrad tab shows a run written on JAX: a real TensorBoard server and a real browser."""

import io
import json
import time
import urllib.request

import pytest
from tensorboard_process import tensorboard_process
from test_dashboard_logs import headless_chromium, wait_for

import kgrad
from kgrad import demo

pytestmark = pytest.mark.slow  # a server subprocess, a browser
LAYERS = [f"hidden_{i}" for i in range(1, 9)] + ["output"]


@pytest.fixture(scope="module")
def jax_logs(tmp_path_factory):
    log_dir = str(tmp_path_factory.mktemp("jax") / "demo")
    demo.run_demo(log_dir, epochs=2, overwrite=True, out=io.StringIO())
    return log_dir


def _runs(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/kgrad/runs", timeout=30) as response:
        return json.loads(response.read())["runs"]


def test_the_tab_shows_every_layer_of_a_jax_run_in_forward_order(jax_logs, tmp_path):
    expected = {
        run.run: [layer.layer for layer in run.layers if "vanishing" in layer.flags]
        for run in kgrad.health_report(kgrad.read_logs(jax_logs))
    }
    with tensorboard_process(jax_logs, tmp_path / "stderr.txt") as (process, port):
        deadline = time.monotonic() + 120
        while True:
            try:
                if {"sigmoid_deep/kgrad", "relu_deep/kgrad"} <= set(_runs(port)):
                    break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, (
                tmp_path / "stderr.txt"
            ).read_text()
            time.sleep(0.5)
        driver = headless_chromium()
        try:
            driver.set_window_size(1400, 900)
            driver.get(f"http://127.0.0.1:{port}/#kgrad")
            driver.switch_to.frame(wait_for(driver, "document.querySelector('iframe')"))
            wait_for(driver, "document.querySelector('.body[data-state=ready]')")
            for run in ("sigmoid_deep/kgrad", "relu_deep/kgrad"):
                rows = driver.execute_script(
                    "return [...document.querySelectorAll(arguments[0] + ' .row-label')]"
                    ".map((r) => [r.dataset.layer, r.dataset.flags])",
                    f'section.run-column[data-run="{run}"]',
                )
                assert [layer for layer, _ in rows] == LAYERS
                assert [layer for layer, flags in rows if "vanishing" in flags] == expected[run]
            assert expected["sigmoid_deep/kgrad"][:3] == ["hidden_1", "hidden_2", "hidden_3"]
            assert expected["relu_deep/kgrad"] == []
            driver.save_screenshot(str(tmp_path / "jax_tab.png"))
        finally:
            driver.quit()
