"""Spikes and what moved first (kgrad.report.stability): hand-made series, then a real fit."""

import contextlib
import io
import math
import re

import keras
import numpy as np
import pytest

import kgrad
from kgrad.cli import main
from kgrad.logs.reading import Series
from kgrad.report import stability

NAN, INF = math.nan, math.inf
FLAT = [1.0, 1.1, 0.9, 1.0, 1.1, 0.9, 1.0, 1.1]  # mean 1.0125, σ ≈ 0.078


@pytest.mark.parametrize(
    "values, kwargs, expected",
    [
        (FLAT + [1.2], {}, []),  # within 6σ
        (FLAT + [1.6], {}, [8]),  # mean + 6σ ≈ 1.48
        (FLAT + [1.6], {"sigmas": 8.0}, []),  # mean + 8σ ≈ 1.64
        (FLAT[:7] + [9.0], {}, []),  # 7 previous probes: fewer than min_history
        (FLAT[:7] + [9.0], {"min_history": 7}, [7]),
        (FLAT + [NAN, 9.0], {}, [8, 9]),  # a blow-up spikes; the history keeps the finite values
        (FLAT + [INF], {}, [8]),
        ([NAN] * 8 + [5.0], {}, []),  # no finite history
        ([5.0] * 8 + [5.0, 5.1], {}, [9]),  # σ = 0: any rise spikes
        # Only the previous `history` probes count: the early 100s are forgotten.
        ([100.0] * 4 + FLAT + [1.6], {"history": 8}, [12]),
        ([100.0] * 4 + FLAT + [1.6], {"history": 12}, []),
    ],
)
def test_spike_indices(values, kwargs, expected):
    assert stability.spike_indices(values, **kwargs) == expected


def _series(values, start=0):
    return Series(np.arange(start, start + len(values)), np.asarray(values, dtype=np.float64))


def _quiet(length):
    return [1.0 + 0.01 * ((index % 3) - 1) for index in range(length)]


def _with_spikes(length, spikes):
    values = _quiet(length)
    for index, value in spikes.items():
        values[index] = value
    return values


def test_loss_spike_names_the_layers_that_spiked_first_earliest_first():
    scalars = {
        "global/loss": _series(_with_spikes(40, {30: 9.0})),
        "global/grad_norm": _series(_with_spikes(40, {29: 9.0})),
        # In forward order, as read_logs gives them; the later layer spiked earlier.
        "adam_rms/block_1/dense/kernel": _series(_with_spikes(40, {28: 9.0})),
        "adam_rms/block_1/dense/bias": _series(_with_spikes(40, {26: 9.0})),
        "adam_rms/block_2/dense/kernel": _series(_with_spikes(40, {25: 9.0})),
        "adam_rms/quiet/kernel": _series(_quiet(40)),
        "logit_max_max/output": _series(_with_spikes(40, {30: 9.0})),
        "logit_max_mean/output": _series(_with_spikes(40, {20: 9.0})),  # not a signal
        # Spiked before the window (30 - 16 = 14): not named.
        "adam_rms/early/kernel": _series(_with_spikes(40, {12: 9.0})),
    }
    report = stability.stability_report(scalars)
    (loss,) = report.loss_spikes
    assert (loss.step, loss.value) == (30, 9.0)
    assert [(lead.layer, lead.signal, lead.step, lead.probes_ahead) for lead in loss.leaders] == [
        ("block_2/dense", "adam_rms", 25, 5),
        ("block_1/dense", "adam_rms", 26, 4),  # its bias's spike, before its kernel's
        ("output", "max logit", 30, 0),
    ]
    assert set(report.spikes) == {
        "global/loss", "global/grad_norm", "adam_rms/block_1/dense/kernel", "adam_rms/block_1/dense/bias",
        "adam_rms/block_2/dense/kernel", "logit_max_max/output", "adam_rms/early/kernel",
    }
    assert report.signals[:2] == ("global/loss", "global/grad_norm")


@pytest.mark.parametrize(
    "window, expected",
    [(16, ["block_2/dense"]), (4, []), (5, ["block_2/dense"])],
)
def test_the_window_is_counted_in_probes_not_steps(window, expected):
    # Probed every 10 steps: the loss spikes at probe 30 (step 300), the layer at probe 25.
    steps = np.arange(0, 400, 10)
    scalars = {
        "global/loss": Series(steps, np.asarray(_with_spikes(40, {30: 9.0}))),
        "adam_rms/block_2/dense/kernel": Series(steps, np.asarray(_with_spikes(40, {25: 9.0}))),
    }
    (loss,) = stability.stability_report(scalars, window=window).loss_spikes
    assert [lead.layer for lead in loss.leaders] == expected
    assert [lead.step for lead in loss.leaders] == [250] * len(expected)


def test_without_a_loss_tag_spikes_are_found_and_no_loss_spike_is_reported():
    report = stability.stability_report({"global/grad_norm": _series(_with_spikes(20, {15: 9.0}))})
    assert report.loss_spikes == ()
    assert [spike.step for spike in report.spikes["global/grad_norm"]] == [15]
    assert stability.stability_report({"grad_norm/dense": _series([1.0] * 8 + [9.0])}).spikes == {}


def test_an_attention_layer_spikes_by_its_largest_head():
    # One signal per layer: the max over its heads at each probe (head 0 is the larger one here).
    rng = np.random.default_rng(0)
    head_0 = np.asarray(_with_spikes(40, {27: 5.0}))
    head_1 = np.clip(rng.normal(0.5, 0.4, size=40), 0, 0.99)
    scalars = {
        "global/loss": _series(_with_spikes(40, {30: 9.0})),
        "attention_logit_max/transformer_layer_0/self_attention/head_0": _series(head_0),
        "attention_logit_max/transformer_layer_0/self_attention/head_1": _series(head_1),
    }
    report = stability.stability_report(scalars)
    layer = "attention_logit_max/transformer_layer_0/self_attention"
    assert report.signals == ("global/loss", layer)  # the heads themselves are not signals
    assert [spike.step for spike in report.spikes[layer]] == [27]
    assert report.spikes[layer][0].value == 5.0
    (loss,) = report.loss_spikes
    assert [(lead.layer, lead.signal, lead.step) for lead in loss.leaders] == [
        ("transformer_layer_0/self_attention", "attention logit max", 27)
    ]
    np.testing.assert_array_equal(
        stability.with_layer_head_maxima(scalars)[layer].values, np.maximum(head_0, head_1)
    )


def test_describe_words_the_spikes():
    scalars = {
        "global/loss": _series(_with_spikes(40, {30: 9.0})),
        "adam_rms/dense/kernel": _series(_with_spikes(40, {27: 5.0})),
        "global/grad_norm": _series(_with_spikes(40, {12: 4.0, 30: 9.0})),
    }
    before = np.asarray(_quiet(27))
    size = (5.0 - before.mean()) / before.std()  # the layer's spike, in σ of its previous probes
    assert stability.describe(stability.stability_report(scalars)) == [
        "stability: spikes (above mean + 6σ of the previous 128 probes):",
        "  loss spike at step 30: 9 (mean 1 ± 0.00816); first, within 16 probes: "
        f"at step 27 (3 probes ahead): dense adam_rms ({size:.0f}σ)",
        "  global/grad_norm: 2 spikes, at steps 12, 30",
        "  adam_rms/dense/kernel: 1 spike, at step 27",
    ]
    assert stability.describe(stability.stability_report({"global/loss": _series(_quiet(40))})) == []


def test_kgrad_report_flags_a_planted_learning_rate_blow_up(tmp_path):
    """A real fit: the learning rate is raised x1000 at step 50; the report names the spike and the layers."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(640, 8)).astype("float32")
    y = (x[:, :4].sum(1) > 0).astype("int32")
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu", name="hidden"),
        keras.layers.Dense(16, activation="relu", name="hidden_2"),
        keras.layers.Dense(2, name="out"),
    ])
    optimizer = keras.optimizers.Adam(1e-3)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)

    class RaiseTheLearningRate(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 50:
                optimizer.learning_rate.assign(1.0)

    probe = kgrad.GradientProbe(
        tmp_path, every_n_steps=1, histograms=False, instruments=["optimizer", "logits"]
    )
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
              callbacks=[RaiseTheLearningRate(), probe])
    (run,) = kgrad.health_report(kgrad.read_logs(tmp_path))
    first = run.stability.loss_spikes[0]
    # The update of step 50 is the first with the raised rate: step 51's loss shows it.
    assert first.step == 51 and first.value > 10 * first.mean
    assert {(lead.layer, lead.signal) for lead in first.leaders} >= {
        ("hidden", "adam_rms"), ("hidden_2", "adam_rms"), ("out", "adam_rms"), ("output", "max logit"),
    }
    assert all(lead.step <= spike.step for spike in run.stability.loss_spikes for lead in spike.leaders)
    assert not any(spike.step < 51 for spikes in run.stability.spikes.values() for spike in spikes)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(["report", str(tmp_path)])
    assert "  loss spike at step 51: " in printed.getvalue()
    assert "first, within 16 probes: at step 51 (the same probe), " in printed.getvalue()
    # The tie at step 51: every signal with its size, largest first (not the layers' forward order).
    (tie,) = re.findall(r"at step 51 \(the same probe\), \d+ at once: (.*?)(?: and \d+ more)?$",
                        printed.getvalue(), re.MULTILINE)
    said = re.findall(r"(\S+ (?:adam_rms|max logit)) \((\d+)σ\)", tie)
    leaders = [lead for lead in first.leaders if lead.step == 51]
    spiked = {tag: spike for tag, found in run.stability.spikes.items() for spike in found if spike.step == 51}
    sizes = [(spiked[lead.tag].value - spiked[lead.tag].mean) / spiked[lead.tag].std for lead in leaders]
    assert said == [(f"{lead.layer} {lead.signal}", f"{size:.0f}") for lead, size in zip(leaders[:5], sizes)]
    assert sizes == sorted(sizes, reverse=True) and {"hidden adam_rms", "output max logit"} <= dict(said).keys()


def test_leaders_at_one_probe_are_told_as_a_tie_with_its_size():
    # Five layers spike together 2 probes before the loss, one alone 3 probes before it.
    scalars = {"global/loss": _series(_with_spikes(40, {30: 9.0})),
               "adam_rms/early/kernel": _series(_with_spikes(40, {27: 5.0}))}
    for index in range(5):
        scalars[f"adam_rms/layer_{index}/kernel"] = _series(_with_spikes(40, {28: 5.0}))
    (line,) = [line for line in stability.describe(stability.stability_report(scalars), named=3)
               if "loss spike" in line]
    early = np.asarray(_quiet(27))
    tie = np.asarray(_quiet(28))
    early, tie = ((5.0 - before.mean()) / before.std() for before in (early, tie))
    assert line.endswith(f"first, within 16 probes: at step 27 (3 probes ahead): early adam_rms ({early:.0f}σ); "
                         f"at step 28 (2 probes ahead), 5 at once: layer_0 adam_rms ({tie:.0f}σ), "
                         f"layer_1 adam_rms ({tie:.0f}σ), layer_2 adam_rms ({tie:.0f}σ) and 2 more")
    assert "→" not in line


def test_the_verdict_under_a_loss_spike_counts_it_instead_of_saying_ok(tmp_path, capsys):
    import tensorflow as tf

    loss = _with_spikes(40, {30: 9.0})
    writer = tf.summary.create_file_writer(str(tmp_path / "run" / "kgrad"))
    with writer.as_default():
        for step, value in enumerate(loss):
            tf.summary.scalar("grad_norm/first", 0.5, step=step)
            tf.summary.scalar("grad_norm/last", 1.0, step=step)
            tf.summary.scalar("global/loss", float(value), step=step)
    writer.close()
    assert main(["report", str(tmp_path)]) == 0  # a loss spike is no layer flag
    verdict = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert verdict == "No layer flagged in 1 run; 1 loss spike (stability, above)."


def test_a_layer_that_spikes_twice_before_a_loss_spike_leads_from_its_first_spike():
    # block/dense spikes at probes 22 and 28, the loss at 30 (window 16: from probe 14).
    # Its lead counts from 22, so it is named before other/dense (25), not after it.
    scalars = {
        "global/loss": _series(_with_spikes(40, {30: 9.0})),
        "adam_rms/block/dense/kernel": _series(_with_spikes(40, {22: 9.0, 28: 40.0})),
        "adam_rms/other/dense/kernel": _series(_with_spikes(40, {25: 9.0})),
    }
    report = stability.stability_report(scalars)
    assert [spike.step for spike in report.spikes["adam_rms/block/dense/kernel"]] == [22, 28]
    (loss,) = report.loss_spikes
    assert [(lead.layer, lead.step, lead.probes_ahead) for lead in loss.leaders] == [
        ("block/dense", 22, 8), ("other/dense", 25, 5)]
    # Its kernel's second spike and its bias's first (at 26) do not move it either.
    scalars["adam_rms/block/dense/bias"] = _series(_with_spikes(40, {26: 9.0}))
    (loss,) = stability.stability_report(scalars).loss_spikes
    assert [(lead.layer, lead.step) for lead in loss.leaders] == [("block/dense", 22), ("other/dense", 25)]


def test_a_tie_is_ordered_by_size_not_by_forward_order():
    # Three layers spike at probe 28, in forward order a, b, c; b's spike is the largest.
    scalars = {"global/loss": _series(_with_spikes(40, {30: 9.0}))}
    for layer, value in (("a", 2.0), ("b", 50.0), ("c", 5.0)):
        scalars[f"adam_rms/{layer}/kernel"] = _series(_with_spikes(40, {28: value}))
    (loss,) = stability.stability_report(scalars).loss_spikes
    before = np.asarray(_quiet(28))
    sizes = [(value - before.mean()) / before.std() for value in (50.0, 5.0, 2.0)]
    assert [lead.layer for lead in loss.leaders] == ["b", "c", "a"]
    np.testing.assert_allclose([lead.sigmas for lead in loss.leaders], sizes, rtol=1e-9)
    (line,) = [line for line in stability.describe(stability.stability_report(scalars)) if "loss spike" in line]
    assert line.endswith(f"at step 28 (2 probes ahead), 3 at once: b adam_rms ({sizes[0]:.0f}σ), "
                         f"c adam_rms ({sizes[1]:.0f}σ), a adam_rms ({sizes[2]:.0f}σ)")


def test_an_attention_key_bias_at_rounding_level_is_not_scored_and_the_report_says_why():
    # The key bias's adam_rms spikes first and most, but its gradient is ~1e-8 of the key kernel's.
    scalars = {"global/loss": _series(_with_spikes(40, {30: 9.0}))}
    for part, norm, spike in (("kernel", 1e-2, {28: 9.0}), ("bias", 2e-10, {26: 90.0})):
        scalars[f"adam_rms/mha/key/{part}"] = _series(_with_spikes(40, spike))
        scalars[f"weight_grad_norm/mha/key/{part}"] = _series(np.full(40, norm) * _quiet(40))
    report = stability.stability_report(scalars)
    assert "adam_rms/mha/key/bias" not in report.spikes and "adam_rms/mha/key/bias" not in report.signals
    (loss,) = report.loss_spikes
    assert [(lead.tag, lead.step) for lead in loss.leaders] == [("adam_rms/mha/key/kernel", 28)]
    ((tag, reason),) = report.not_scored
    assert tag == "adam_rms/mha/key/bias" and "rounding noise" in reason and "mha/key/kernel" in reason
    assert f"  not scored: adam_rms/mha/key/bias ({reason})" in stability.describe(report)
    # A bias at an ordinary size beside its kernel is scored.
    scalars["weight_grad_norm/mha/key/bias"] = _series(np.full(40, 1e-3) * _quiet(40))
    report = stability.stability_report(scalars)
    assert report.not_scored == () and report.loss_spikes[0].leaders[0].tag == "adam_rms/mha/key/bias"
