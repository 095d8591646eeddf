"""The stability view of a transformer-like run, read by a person: labels, the attention axis, ties.

A run written with kgrad's writer as ``examples/instability.py``'s GPT-2 logs it
(19 adam_rms rows named ``transformer_layer_<i>/<sublayer>``; every one spikes at
the probe after a raised learning rate; the attention maxima go from ~0.05 to
2390, the first spikes ~10), in a real TensorBoard server and headless chromium
at 1400x900 and 800x600. The rows' labels are readable (whole where there is
room, else shortened in the middle, never two alike), the attention chart's
first spikes stand well off its floor, and the 19 leaders at one probe are one
tie of 20 (with the attention layer), not a chain of arrows. Screenshots go to ``KGRAD_TAB_SCREENSHOTS``.
"""

import os

import numpy as np
import pytest
from tensorboard_process import tensorboard_process
from test_dashboard_live import _wait_for_runs
from test_dashboard_logs import headless_chromium, wait_for

from kgrad.logs.record import ProbeRecord
from kgrad.logs.writer import ProbeWriter

pytestmark = pytest.mark.slow  # a server subprocess, a browser: tens of seconds

SIZES = [(1400, 900), (800, 600)]
SUBLAYERS = ["self_attention/query", "self_attention/key", "self_attention/value", "self_attention/attention_output",
             "self_attention_layer_norm", "feedforward_intermediate_dense", "feedforward_output_dense",
             "feedforward_layer_norm"]
LAYERS = (["token_embedding", "position_embedding"]
          + [f"transformer_layer_{i}/{sub}" for i in range(2) for sub in SUBLAYERS] + ["layer_norm"])
STEPS, RAISED, LOSS_SPIKE = 80, 51, 53


def _attention(step):
    """~0.05 before the raise; 10 at the first probe after it, growing to 2390 by the last step."""
    if step < RAISED:
        return 0.05 + 0.001 * np.sin(step)
    return 10.0 * (2390.0 / 10.0) ** ((step - RAISED) / (STEPS - 1 - RAISED))


def _write_run(log_dir):
    writer = ProbeWriter(log_dir)
    for step in range(STEPS):
        scalars = {"global/loss": 2.0 + 0.01 * np.sin(step) + (5.0 if step == LOSS_SPIKE else 0.0)}
        for index, layer in enumerate(LAYERS):
            scalars[f"grad_norm/{layer}"] = 1.0
            base = 0.1 * (1 + index % 3) * (1 + 0.01 * np.sin(step + index))
            scalars[f"adam_rms/{layer}/kernel"] = base * (50.0 if step == RAISED else 1.0)
        scalars["attention_logit_max/transformer_layer_0/self_attention/head_0"] = _attention(step)
        writer.write(ProbeRecord(step, scalars, {}))
    writer.close()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("readable")
    _write_run(str(log_dir / "gpt2"))
    stderr_path = tmp_path_factory.mktemp("tensorboard") / "stderr.txt"
    with tensorboard_process(log_dir, stderr_path) as (process, port):
        _wait_for_runs(port, process, stderr_path)
        driver = headless_chromium()
        try:
            yield driver, port
        finally:
            driver.quit()


_VIEW = """
const view = document.querySelector('.stability');
const svg = view.querySelector('svg.chart[data-part=attention]');
const first = [...svg.querySelectorAll('circle.spike-mark')].find((m) => Number(m.dataset.step) === arguments[0]);
return {
  labels: [...view.querySelectorAll('.row-label')].map((l) => {
    const name = l.querySelector('.name');
    return [l.dataset.layer, name.textContent, name.scrollWidth, name.clientWidth];
  }),
  scale: svg.dataset.scale,
  chartTitle: svg.closest('.chart-row').querySelector('.chart-title').textContent,
  chart: [svg.getBoundingClientRect().top, svg.getBoundingClientRect().bottom],
  firstSpike: first ? first.getBoundingClientRect().top + first.getBoundingClientRect().height / 2 : null,
  ties: [...view.querySelectorAll('.loss-spikes li .tie')].map((t) => [Number(t.dataset.step), Number(t.dataset.size),
    t.querySelectorAll(':scope > .lead').length, t.querySelector('details summary')?.textContent]),
  spikeText: view.querySelector('.loss-spikes li').textContent,
};
"""


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
def test_the_stability_view_reads_at(page, size):
    driver, port = page
    driver.switch_to.default_content()
    driver.set_window_size(*size)
    driver.get("about:blank")
    driver.get(f"http://127.0.0.1:{port}/#kgrad")
    driver.switch_to.frame(wait_for(driver, "document.querySelector('iframe')"))
    wait_for(driver, "document.querySelector('.body[data-state=ready] .stability .loss-spikes')")
    view = driver.execute_script(_VIEW, RAISED)
    folder = os.environ.get("KGRAD_TAB_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        for part, selector in (("rows", ".stability .legend"), ("charts", ".stability svg.chart"),
                               ("spikes", ".stability .loss-spikes")):
            driver.execute_script(f"document.querySelector('{selector}').scrollIntoView({{block: 'start'}})")
            driver.save_screenshot(os.path.join(folder, f"readable_{size[0]}x{size[1]}_{part}.png"))
    # Labels: each row's own, whole where there is room, else shortened in the middle with its end kept.
    assert [layer for layer, _, _, _ in view["labels"]] == LAYERS
    shown = [text for _, text, _, _ in view["labels"]]
    assert len(set(shown)) == len(LAYERS)  # no two rows read alike ("transformer_layer_0/self…" did, 16 of 19)
    for layer, text, scroll_width, client_width in view["labels"]:
        assert scroll_width <= client_width + 1, (layer, text)  # nothing cut by the box
        if text != layer:  # shortened: its pieces in order, the start and the last part kept, its block's index
            pieces = text.split("…")
            assert layer.startswith(pieces[0]) and layer.endswith(layer.rpartition("/")[2]) and pieces[-1].endswith(
                layer.rpartition("/")[2]), (layer, text)
            position = 0
            for piece in pieces:
                position = layer.index(piece, position) + len(piece)
            if layer.startswith("transformer_layer_"):
                assert f"layer_{layer[len('transformer_layer_')]}/" in text, (layer, text)
    if size[0] >= 1400:
        assert shown == LAYERS  # room for every name whole
    # The attention chart: a log axis, on which the first spikes (10 against 0.05, under a top
    # of 2390) stand well off the floor; on a linear axis they sat at 0.4% of its height.
    assert view["scale"] == "log" and view["chartTitle"].endswith("(log)")
    top, bottom = view["chart"]
    assert view["firstSpike"] is not None and (bottom - view["firstSpike"]) / (bottom - top) > 0.3
    # The leaders: one tie of 20 (19 adam_rms rows and the attention layer) at the probe after
    # the raise, 4 named and the others folded.
    tie = len(LAYERS) + 1
    assert view["ties"] == [[RAISED, tie, 4, f"and {tie - 4} more"]]
    assert "→" not in view["spikeText"] and f"{tie} at once" in view["spikeText"]
