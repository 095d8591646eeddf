"""examples/instability.py: kgrad flags a planted blow-up on a tiny KerasHub GPT-2 before the loss spikes.

The example runs as a script (as tests/test_examples.py runs the others); its
event files are read back with `kgrad.read_logs` and the spike rule (mean + 6σ
of the previous 128 probes) is recomputed here in NumPy, not taken from kgrad.
"""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import kgrad

pytest.importorskip("keras_hub")

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "examples" / "instability.py"


def _example():
    spec = importlib.util.spec_from_file_location("instability_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines; training runs only under __main__
    return module


def _spike_steps(series, sigmas=6.0, history=128, min_history=8):
    """Steps above mean + sigmas·σ of the previous finite values (the reference, in NumPy)."""
    found = []
    for index, value in enumerate(series.values):
        before = series.values[max(0, index - history):index]
        before = before[np.isfinite(before)]
        if len(before) < min_history:
            continue
        if not np.isfinite(value) or value > before.mean() + sigmas * before.std():
            found.append(int(series.steps[index]))
    return found


def _layer_signals(scalars):
    """``{(layer or output, signal, tag): Series}``: adam_rms per weight, the max logit, and an
    attention layer's largest score over its heads (their maximum computed here)."""
    signals, heads = {}, {}
    for tag, series in scalars.items():
        kind, _, name = tag.partition("/")
        if kind == "adam_rms":
            signals[name.rpartition("/")[0], "adam_rms", tag] = series
        elif kind == "logit_max_max":
            signals[name, "max logit", tag] = series
        elif kind == "attention_logit_max":
            heads.setdefault(name.rpartition("/")[0], []).append(series)
    for layer, series in heads.items():
        values = np.max([head.values for head in series], axis=0)
        signals[layer, "attention logit max", layer] = type(series[0])(series[0].steps, values)
    return signals


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("instability") / "logs"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(log_dir)], capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""), check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, kgrad.read_logs(log_dir)


def test_the_schedule_raises_the_rate_at_step_50():
    example = _example()
    schedule = example.RaiseAt(1e-3, 50, 100.0)
    rates = [float(schedule(np.int64(step))) for step in (0, 49, 50, 79)]
    np.testing.assert_allclose(rates, [1e-3, 1e-3, 0.1, 0.1], rtol=1e-6)


def test_a_layer_is_flagged_before_the_loss_spikes(run):
    out, logs = run
    scalars = logs["kgrad"]["scalars"]
    example = _example()
    raise_step = example.RAISE_STEP
    loss = scalars["global/loss"]
    assert loss.steps.tolist() == list(range(example.STEPS))  # every step probed
    # The blow-up: the first loss spike after the raise, and it is a real rise.
    loss_spike = next((step for step in _spike_steps(loss) if step > raise_step), None)
    assert loss_spike is not None, f"no loss spike after the raise: {loss.values.round(2).tolist()}"
    assert loss.values[loss_spike] > 1.5 * loss.values[raise_step]
    # The layer signals that spiked after the raise and before the loss spike.
    signals = _layer_signals(scalars)
    assert {"adam_rms", "max logit", "attention logit max"} <= {signal for _, signal, _ in signals}
    flags = {key: [step for step in _spike_steps(series) if raise_step < step < loss_spike]
             for key, series in signals.items()}
    assert any(flags.values()), f"no layer signal spiked between the raise and step {loss_spike}"
    first_step = min(steps[0] for steps in flags.values() if steps)
    first = {key[:2] for key, steps in flags.items() if steps and steps[0] == first_step}
    # What the example printed is that: the lead in probes, the step, a layer that spiked there.
    printed = re.search(r"kgrad flagged it (\d+) probes? ahead, at step (\d+): (\d+) layer signals spiked there "
                        r"at once, the largest (\S+) \(([^,]+), (\d+)σ\)", out)
    assert printed, out
    probes, step, count, layer, signal, size = printed.groups()
    assert (int(probes), int(step)) == (loss_spike - first_step, first_step)
    assert (layer, signal) in first, (layer, signal, sorted(first))
    # A tie, said with its size: the largest of the signals that spiked there (σ above the
    # mean of their previous probes, in NumPy here), the key biases (rounding noise) left out.
    sizes = {}
    for key, series in signals.items():
        if flags[key] and flags[key][0] == first_step and "/key/bias" not in key[2]:
            index = series.steps.tolist().index(first_step)
            before = series.values[max(0, index - 128):index]
            before = before[np.isfinite(before)]
            sizes[key[:2]] = max(sizes.get(key[:2], -np.inf), (series.values[index] - before.mean()) / before.std())
    assert max(sizes, key=sizes.get) == (layer, signal) and int(size) == round(max(sizes.values()))
    (report,) = kgrad.health_report(logs)
    (spike,) = [spike for spike in report.stability.loss_spikes if spike.step == loss_spike]
    assert int(count) == len([lead for lead in spike.leaders if lead.step == first_step]) == len(sizes)
    # ... and one of the model's layers (a weight's path less its last part, or a layer
    # above it, as an attention layer is above its query kernel), or its output.
    model = example.build_model()
    layers = {weight.path.rsplit("/", parts)[0] for weight in model.weights
              for parts in range(1, weight.path.count("/") + 1)}
    assert layer in layers | {example.OUTPUT}, (layer, sorted(layers))
    assert f"loss spike at step {loss_spike}:" in out


def test_the_key_biases_are_rounding_noise_and_never_named(run):
    """Softmax ignores a constant added to every key's score: the key bias's gradient is 0 in exact
    arithmetic, and its float32 gradient is rounding noise. The report leaves it out and says why."""
    _, logs = run
    scalars = logs["kgrad"]["scalars"]
    (report,) = kgrad.health_report(logs)
    biases = [f"transformer_layer_{index}/self_attention/key/bias" for index in range(2)]
    for bias in biases:
        kernel = bias.replace("/bias", "/kernel")
        ratio = (np.median(scalars[f"weight_grad_norm/{bias}"].values)
                 / np.median(scalars[f"weight_grad_norm/{kernel}"].values))
        assert ratio < 1e-6, (bias, ratio)  # the query bias, for comparison, is ~1e-1 of its kernel's
    not_scored = dict(report.stability.not_scored)
    assert set(not_scored) == {f"adam_rms/{bias}" for bias in biases}, not_scored
    assert all("rounding noise" in reason for reason in not_scored.values())
    named = [lead.tag for spike in report.stability.loss_spikes for lead in spike.leaders]
    assert named and not any("/key/bias" in tag for tag in named)
    assert not any("/key/bias" in tag for tag in report.stability.spikes)
