"""How fast the kgrad tab is on a big run: 200 layers x 10 000 probed steps.

Writes a synthetic kgrad run with kgrad's own writer (the default probe's
scalar tags per layer: norms, update ratios, zero fraction, NaN/Inf count;
``grad_hist`` histograms of ``--histogram-layers`` layers), then times:

- ``route cold``: the first ``/heatmap`` request of a fresh plugin (reading
  every event file, building the matrix), in process through the plugin's
  WSGI app, and ``route warm``: the same request again (cached);
- the bytes of that answer, raw and gzipped (what TensorBoard sends);
- ``browser``: a real ``tensorboard --logdir`` and headless chromium: from
  opening ``/#kgrad`` until the tab has drawn (``data-state=ready``), and the
  canvas paint of one heatmap as the page measured it.

Run: ``python -m benchmarks.dashboard_scale`` (about 2 minutes on 2 cores;
``--layers 20 --steps 1000`` for a quick look). Prints one line per figure.
"""

import argparse
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from kgrad.logs.record import ProbeRecord  # noqa: E402
from kgrad.logs.writer import ProbeWriter  # noqa: E402


def layer_tags(layer):
    """The scalar tags the default probe writes for one Dense layer."""
    return [
        f"activation_zero_fraction/{layer}",
        f"grad_norm/{layer}",
        f"grad_nonfinite/{layer}",
        f"weight_norm/{layer}/kernel",
        f"weight_norm/{layer}/bias",
        f"weight_grad_norm/{layer}/kernel",
        f"update_ratio/{layer}/kernel",
        f"update_ratio/{layer}/bias",
    ]


def write_synthetic_run(
    log_dir, layers, steps, histogram_layers, buckets=30, every_n_steps=100, tags_of=layer_tags
):
    """Writes ``<log_dir>/kgrad``: gradients that shrink 10x every 40 layers, with noise.

    Returns:
        The layer names, in forward order. ``tags_of(layer)`` gives each
        layer's scalar tags (default: `layer_tags`).
    """
    rng = np.random.default_rng(0)
    names = [f"dense_{index:03d}" for index in range(layers)]
    tags = [tag for name in names for tag in tags_of(name)]
    scale = np.repeat(10.0 ** (-np.arange(layers) / 40.0), len(tags_of("x")))
    nonfinite = np.array([index for index, tag in enumerate(tags) if "_nonfinite/" in tag], np.int64)
    edges = np.linspace(-1.0, 1.0, buckets + 1)
    writer = ProbeWriter(log_dir)
    for step in range(steps):
        values = scale * (1.0 + 0.2 * rng.random(len(tags)))
        values[nonfinite] = 0.0
        if step % 1000 == 999 and nonfinite.size:  # a NaN now and then in one layer: timeline marks
            values[nonfinite[(step // 1000) * 7 % nonfinite.size]] = 3.0
        histograms = {
            f"grad_hist/{name}": np.stack(
                [edges[:-1] * 1e-2, edges[1:] * 1e-2, rng.random(buckets) * 100], axis=1
            )
            for name in names[:histogram_layers]
        }
        writer.write(ProbeRecord(step * every_n_steps, dict(zip(tags, values.tolist())), histograms))
    writer.close()
    return names


def time_route(log_dir, run, layers, steps):
    """(cold s, warm s, raw bytes, gzip bytes) of ``/heatmap`` through a fresh plugin."""
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client

    from kgrad.dashboard.plugin import KgradPlugin

    plugin = KgradPlugin(base_plugin.TBContext(logdir=log_dir))
    client = Client(plugin.get_plugin_apps()["/heatmap"])
    timings, body = [], b""
    for _ in range(2):
        start = time.perf_counter()
        response = client.get("/heatmap", query_string={"run": run, "quantity": "weight_grad"})
        body = response.get_data()
        timings.append(time.perf_counter() - start)
        if response.status_code != 200:
            raise RuntimeError(f"/heatmap answered {response.status_code}: {body[:300]!r}")
    heatmap = json.loads(body)
    if len(heatmap["layers"]) != layers or len(heatmap["steps"]) != steps:
        raise RuntimeError(f"served {len(heatmap['layers'])} layers x {len(heatmap['steps'])} steps")
    return timings[0], timings[1], len(body), len(gzip.compress(body, 3))


def _until_drawn(driver, deadline):
    """Waits until the kgrad tab has drawn (inside TensorBoard's iframe); returns the time."""
    while True:
        frames = driver.find_elements("css selector", "iframe")
        if frames:
            driver.switch_to.frame(frames[0])
            if driver.execute_script("return !!document.querySelector('.body[data-state=ready]')"):
                return time.perf_counter()
            driver.switch_to.default_content()
        if time.monotonic() > deadline:
            raise RuntimeError("the tab did not draw")
        time.sleep(0.1)


def time_browser(log_dir, timeout_s=600):
    """([s until drawn on a fresh server, s on reload], canvas paint ms): tensorboard + chromium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            log_dir,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1500,1200"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        deadline = time.monotonic() + timeout_s
        while True:  # wait for the server, not for the tab
            try:
                driver.get(f"http://127.0.0.1:{port}/data/plugin/kgrad/style.css")
                if "kgrad" in driver.page_source:
                    break
            except Exception:  # noqa: BLE001 (not listening yet)
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("tensorboard did not start")
            time.sleep(0.5)
        start = time.perf_counter()
        driver.get(f"http://127.0.0.1:{port}/#kgrad")
        seconds = [_until_drawn(driver, deadline) - start]
        paint_ms = float(
            driver.execute_script("return document.querySelector('canvas.heatmap-canvas').dataset.renderMs")
        )
        driver.switch_to.default_content()
        start = time.perf_counter()
        driver.refresh()  # the plugin's cache is warm now
        seconds.append(_until_drawn(driver, deadline) - start)
        return seconds, paint_ms
    finally:
        driver.quit()
        server.terminate()
        server.wait(timeout=30)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--histogram-layers", type=int, default=20)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--log-dir", help="default: a temporary folder")
    args = parser.parse_args(argv)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="kgrad_dashboard_scale_")
    try:
        _measure(args, log_dir)
    finally:
        if not args.log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)


def _measure(args, log_dir):
    start = time.perf_counter()
    write_synthetic_run(log_dir, args.layers, args.steps, args.histogram_layers)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(log_dir) for f in files)
    print(
        f"wrote {args.layers} layers x {args.steps} probed steps ({size / 1e6:.0f} MB) "
        f"in {time.perf_counter() - start:.1f} s: {log_dir}"
    )
    cold, warm, raw, zipped = time_route(log_dir, "kgrad", args.layers, args.steps)
    print(
        f"/heatmap: cold {cold:.1f} s (read every event + matrix), warm {warm * 1e3:.0f} ms; "
        f"{raw / 1e6:.1f} MB JSON, {zipped / 1e6:.1f} MB gzipped; every step served"
    )
    if not args.no_browser:
        seconds, paint_ms = time_browser(log_dir)
        print(
            f"browser: tab drawn {seconds[0]:.1f} s after opening /#kgrad on a fresh server, "
            f"{seconds[1]:.1f} s on reload (cache warm); heatmap canvas paint {paint_ms:.0f} ms"
        )


if __name__ == "__main__":
    main()
