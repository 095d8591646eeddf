"""The kgrad tab serves every step of a run of 200 layers x 10 000 probed steps.

Through the plugin's own WSGI app, in process (no server): what a browser
would receive. The time it takes is printed, not asserted; the browser's
render time is measured by ``python -m benchmarks.dashboard_scale``.
"""

import base64
import json
import time

import numpy as np
from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from benchmarks.dashboard_scale import write_synthetic_run
from kgrad.dashboard.plugin import KgradPlugin

LAYERS, STEPS, EVERY = 200, 10_000, 100


def _two_tags(layer):
    return [f"grad_norm/{layer}", f"weight_grad_norm/{layer}/kernel"]


def test_every_step_of_200_layers_by_10000_steps_is_served(tmp_path, capsys):
    names = write_synthetic_run(
        tmp_path, LAYERS, STEPS, histogram_layers=0, every_n_steps=EVERY, tags_of=_two_tags
    )
    client = Client(KgradPlugin(base_plugin.TBContext(logdir=str(tmp_path))).get_plugin_apps()["/heatmap"])
    start = time.perf_counter()
    response = client.get("/heatmap", query_string={"run": "kgrad", "quantity": "grad"})
    seconds = time.perf_counter() - start
    assert response.status_code == 200
    heatmap = json.loads(response.get_data())
    assert heatmap["layers"] == names
    assert heatmap["steps"] == list(range(0, STEPS * EVERY, EVERY))
    matrix = np.frombuffer(base64.b64decode(heatmap["values"]), "<f4").reshape(LAYERS, STEPS)
    assert np.isfinite(matrix).all() and (matrix > 0).all()  # no step left out
    # Layer k is 10 ** (-k / 40) x (1 + 20% noise), as written.
    expected = 10.0 ** (-np.arange(LAYERS) / 40.0)
    assert np.all((matrix >= expected[:, None] * 0.999) & (matrix <= expected[:, None] * 1.2 * 1.001))
    with capsys.disabled():
        print(f"\n/heatmap of {LAYERS} layers x {STEPS} steps (cold, read from disk): {seconds:.1f} s")
