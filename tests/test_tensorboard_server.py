"""A real ``tensorboard --logdir`` server shows what `GradientProbe` wrote.

Starts TensorBoard as a subprocess on a free loopback port and reads its HTTP
data API (what the web page itself requests). The server is always stopped.
"""

import json
import time
import urllib.parse
import urllib.request

import keras
import numpy as np
import pytest

import kgrad
from tensorboard_process import tensorboard_process
from test_tensorboard_writer import tiny_model

# A server subprocess and a fit: seconds, not milliseconds.
pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 120
BATCH = 4
# Elements of each histogrammed tensor of the tiny model below (3 -> 2 -> 1).
ELEMENTS = {
    "activation_hist/hidden": BATCH * 2,
    "grad_hist/hidden": BATCH * 2,
    "activation_hist/out": BATCH,
    "grad_hist/out": BATCH,
    "pred_grad_hist/output": BATCH,
    "input_grad_hist/input": BATCH * 3,
    "weight_grad_hist/hidden/kernel": 3 * 2,
    "weight_grad_hist/hidden/bias": 2,
    "weight_grad_hist/out/kernel": 2,
    "weight_grad_hist/out/bias": 1,
}


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    keras.utils.set_random_seed(0)
    log_dir = tmp_path_factory.mktemp("logs")
    model = tiny_model()
    records = []
    probe = kgrad.GradientProbe(
        log_dir, every_n_steps=2, bucket_count=5, on_probe=records.append, statistics="all"
    )
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 3)), rng.normal(size=(16, 1))
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=2,
        verbose=0,
        validation_data=(x, y),
        callbacks=[keras.callbacks.TensorBoard(log_dir), probe],
    )
    return {"log_dir": str(log_dir), "records": records}


# No proxy: the server is on loopback whatever http_proxy says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get_json(base, path, **params):
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with _OPENER.open(url, timeout=30) as response:
        return json.loads(response.read().decode("utf-8"))


def _wait_until_loaded(process, base, expected_runs, stderr_path):
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    last_error = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"tensorboard exited with {process.returncode}:\n{stderr_path.read_text()[-3000:]}")
        try:
            tags = _get_json(base, "/data/plugin/scalars/tags")
            if expected_runs <= set(tags) and tags.get("kgrad"):
                return
        except OSError as error:  # not listening yet
            last_error = error
        time.sleep(0.5)
    pytest.fail(f"tensorboard did not serve {sorted(expected_runs)} in {STARTUP_TIMEOUT_S} s ({last_error})")


@pytest.fixture(scope="module")
def server(logged, tmp_path_factory):
    stderr_path = tmp_path_factory.mktemp("tensorboard") / "stderr.txt"
    with tensorboard_process(logged["log_dir"], stderr_path) as (process, port):
        base = f"http://127.0.0.1:{port}"
        _wait_until_loaded(process, base, {"kgrad", "train", "validation"}, stderr_path)
        yield base


def test_runs_are_kgrad_beside_keras(server):
    assert sorted(_get_json(server, "/data/runs")) == ["kgrad", "train", "validation"]


def test_scalar_tags_are_the_ones_kgrad_wrote_with_descriptions(server, logged):
    tags = _get_json(server, "/data/plugin/scalars/tags")["kgrad"]
    assert set(tags) == set(logged["records"][0].scalars)
    assert {"grad_norm/hidden", "activation_zero_fraction/hidden", "global/grad_norm"} <= set(tags)
    assert (
        "kgrad: L2 norm of dJ/d(output of layer <code>hidden</code>)"
        in tags["grad_norm/hidden"]["description"]
    )


def test_scalar_values_are_the_probed_values_at_optimizer_steps(server, logged):
    records = logged["records"]
    assert [record.step for record in records] == [0, 2, 4, 6]
    for tag in records[0].scalars:
        points = _get_json(server, "/data/plugin/scalars/scalars", run="kgrad", tag=tag)
        assert [step for _, step, _ in points] == [0, 2, 4, 6], tag
        expected = [record.scalars[tag] for record in records]
        np.testing.assert_allclose([value for _, _, value in points], expected, rtol=1e-6, err_msg=tag)


def test_histogram_counts_add_up_to_the_elements_of_the_tensor(server, logged):
    tags = _get_json(server, "/data/plugin/histograms/tags")["kgrad"]
    assert set(tags) == set(ELEMENTS)
    for tag, elements in ELEMENTS.items():
        points = _get_json(server, "/data/plugin/histograms/histograms", run="kgrad", tag=tag)
        assert [step for _, step, _ in points] == [0, 2, 4, 6], tag
        for (_, _, buckets), record in zip(points, logged["records"]):
            buckets = np.array(buckets)
            assert buckets.shape == (5, 3), tag
            assert buckets[:, 2].sum() == elements, tag
            np.testing.assert_allclose(buckets, record.histograms[tag], rtol=1e-6, err_msg=tag)


def test_custom_scalars_chart_shows_every_layer_gradient_norm(server, logged):
    layout = _get_json(server, "/data/plugin/custom_scalars/layout")
    charts = {chart["title"]: chart for category in layout["category"] for chart in category["chart"]}
    (regex,) = charts["dJ/d(activation) norm: hidden … out"]["multiline"]["tag"]
    data = _get_json(server, "/data/plugin/custom_scalars/scalars", run="kgrad", tag=regex)
    assert data["regex_valid"]
    assert sorted(data["tag_to_events"]) == ["grad_norm/hidden", "grad_norm/out"]
    steps = [step for _, step, _ in data["tag_to_events"]["grad_norm/hidden"]]
    assert steps == [0, 2, 4, 6]
