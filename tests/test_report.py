"""Gradient-health analysis on hand-made logs, with hand-computed values."""

import math

import numpy as np
import pytest

from kgrad.report import health as report, table as report_table
from kgrad.logs.reading import Series

STEPS = np.array([0, 10, 20])


def series(*values, steps=None):
    steps = STEPS[: len(values)] if steps is None else steps
    return Series(np.asarray(steps, np.int64), np.asarray(values, np.float64))


def run_logs(**scalars):
    """A run of read_logs output; keyword ``a__b`` becomes tag ``a/b``."""
    return {"scalars": {tag.replace("__", "/"): value for tag, value in scalars.items()}, "histograms": {}}


def one_run(scalars, thresholds=None):
    (run,) = report.health_report({"kgrad": {"scalars": scalars, "histograms": {}}}, thresholds)
    return {layer.layer: layer for layer in run.layers}, run


def test_weight_gradients_are_combined_per_layer_in_logged_order():
    layers, run = one_run(
        {
            "activation_zero_fraction/late": series(0.0, 0.0, 0.5),
            "grad_norm/late": series(1.0, 1.0, 1.0),
            "grad_norm/early": series(1.0, 1.0, 1.0),
            "weight_grad_norm/m/early/kernel": series(3.0, 3.0, 3.0),
            "weight_grad_norm/m/early/bias": series(4.0, 4.0, 4.0),
            "weight_grad_norm/m/late/kernel": series(10.0, 10.0, 10.0),
            "weight_grad_norm/m/unprobed/kernel": series(1.0, 1.0, 1.0),
        }
    )
    assert list(layers) == ["late", "early", "m/unprobed"]
    assert run.gradient == "dJ/dw" and run.steps.tolist() == [0, 10, 20]
    assert layers["early"].grad_norm == 5.0  # sqrt(3^2 + 4^2)
    assert layers["early"].ratio_to_max == 0.5
    assert layers["late"].zero_fraction == 0.5 and math.isnan(layers["early"].zero_fraction)


def test_the_weights_of_a_recurrent_layers_cell_belong_to_the_recurrent_layer():
    layers, _ = one_run(
        {
            "grad_norm/lstm": series(1.0),
            "grad_norm/forward_gru": series(1.0),
            "grad_norm/backward_gru": series(1.0),
            "grad_norm/encoder": series(1.0),
            "weight_grad_norm/lstm/lstm_cell/kernel": series(3.0),
            "weight_grad_norm/lstm/lstm_cell/recurrent_kernel": series(4.0),
            "weight_grad_norm/both/forward_gru/gru_cell/kernel": series(6.0),
            "weight_grad_norm/both/backward_gru/gru_cell/kernel": series(8.0),
            # A captured nested model holding two uncaptured layers keeps their rows.
            "weight_grad_norm/encoder/first/kernel": series(1.0),
            "weight_grad_norm/encoder/second/kernel": series(2.0),
        }
    )
    assert list(layers) == [
        "lstm", "forward_gru", "backward_gru", "encoder", "encoder/first", "encoder/second"
    ]
    assert layers["lstm"].grad_norm == 5.0  # sqrt(3^2 + 4^2)
    assert layers["forward_gru"].grad_norm == 6.0 and layers["backward_gru"].grad_norm == 8.0
    assert math.isnan(layers["encoder"].grad_norm) and layers["encoder/second"].grad_norm == 2.0


def test_a_recurrent_layer_in_fit_gets_its_cells_gradient_norm_in_the_report_and_the_tab(tmp_path):
    # Reference: a manual GradientTape on the same batch from the same weights.
    import base64

    import keras
    import tensorflow as tf

    import kgrad
    from kgrad.dashboard import views

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((5, 3)),
        keras.layers.LSTM(4, return_sequences=True, name="lstm"),
        keras.layers.GRU(3, name="gru"),
        keras.layers.Dense(1, name="out"),
    ])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.random.default_rng(0).normal(size=(8, 5, 3)).astype("float32")
    y = np.ones((8, 1), "float32")
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x, y, model(x))
    expected = {name: model.get_layer(name).trainable_weights for name in ("lstm", "gru")}
    gradients = dict(zip(
        [w.path for w in model.trainable_weights],
        tape.gradient(loss, model.trainable_weights),
    ))
    norms = {
        name: float(np.sqrt(sum(np.sum(np.square(gradients[w.path])) for w in weights
                                if len(w.shape) >= 2)))
        for name, weights in expected.items()
    }
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=100)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[probe])

    logs = kgrad.read_logs(str(tmp_path))
    (run,) = kgrad.health_report(logs)
    rows = {layer.layer: layer for layer in run.layers}
    assert list(rows) == ["lstm", "gru", "out"]
    for name in ("lstm", "gru"):
        assert rows[name].grad_norm == pytest.approx(norms[name], rel=1e-4)
    heatmap = views.RunView("kgrad", logs["kgrad"]).heatmap("weight_grad")
    assert heatmap["layers"] == ["lstm", "gru", "out"]
    matrix = np.frombuffer(base64.b64decode(heatmap["values"]), "<f4").reshape(3, 1)
    np.testing.assert_allclose(matrix[:2, 0], [norms["lstm"], norms["gru"]], rtol=1e-4)


def test_activation_gradients_are_used_when_weight_gradients_were_not_captured():
    layers, run = one_run({"grad_norm/a": series(2.0, 2.0, 4.0), "grad_norm/b": series(8.0, 8.0, 8.0)})
    assert run.gradient == "dJ/d(output)"
    assert (layers["a"].grad_norm, layers["a"].ratio_to_max) == (4.0, 0.5)


def test_trend_is_last_third_over_first_third_geometric():
    values = [1.0, 4.0, 2.0, 2.0, 8.0, 32.0]
    layers, _ = one_run({"grad_norm/a": series(*values, steps=range(6))})
    # thirds of 6 probes are 2 probes: sqrt(8 * 32) / sqrt(1 * 4) = 8
    assert layers["a"].trend == pytest.approx(8.0)
    single, _ = one_run({"grad_norm/a": series(1.0, steps=[0])})
    assert math.isnan(single["a"].trend)


def test_latest_is_the_highest_step_and_repeated_steps_keep_the_last_value():
    layers, _ = one_run({"grad_norm/a": series(5.0, 1.0, 2.0, 3.0, steps=[20, 0, 10, 20])})
    assert layers["a"].grad_norm == 3.0


def test_update_ratio_of_a_layer_is_over_all_its_weights():
    layers, _ = one_run(
        {
            "weight_grad_norm/m/d/kernel": series(1.0, 1.0, 1.0),
            "weight_grad_norm/m/d/bias": series(1.0, 1.0, 1.0),
            "weight_norm/m/d/kernel": series(3.0, 3.0, 3.0),
            "weight_norm/m/d/bias": series(4.0, 4.0, 4.0),
            "update_ratio/m/d/kernel": series(0.0, 0.0, 0.1),
            "update_ratio/m/d/bias": series(0.0, 0.0, 0.0),
        }
    )
    # ‖Δw‖ = 0.1 * 3 for the kernel, 0 for the bias; ‖w‖ = sqrt(9 + 16) = 5.
    assert layers["m/d"].update_ratio == pytest.approx(0.3 / 5.0)


def test_nonfinite_counts_add_over_probes_and_tensors():
    layers, _ = one_run(
        {
            "grad_norm/d": series(1.0, 1.0, 1.0),
            "activation_nonfinite/d": series(0.0, 2.0, 0.0),
            "grad_nonfinite/d": series(1.0, 0.0, 0.0),
            "weight_grad_norm/m/d/kernel": series(1.0, 1.0, 1.0),
            "weight_grad_nonfinite/m/d/kernel": series(0.0, 0.0, 4.0),
        }
    )
    assert layers["d"].nonfinite == 7
    assert layers["d"].flags == ("nonfinite",)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nan_or_inf_norm_without_a_count_is_nonfinite_not_vanishing(bad):
    # statistics="default" writes dJ/dw's norm and no NaN/Inf count: the norm
    # is NaN/Inf when an element is, and must be read as that, not as small.
    layers, run = one_run(
        {
            "grad_norm/d": series(1.0, 1.0, 1.0),
            "grad_nonfinite/d": series(0.0, 0.0, 0.0),
            "weight_grad_norm/m/d/kernel": series(1.0, bad, 1.0),
            "grad_norm/e": series(1.0, 1.0, 1.0),
            "weight_grad_norm/m/e/kernel": series(1.0, 1.0, bad),
        }
    )
    d, e = layers["d"], layers["e"]
    assert (d.nonfinite, d.nonfinite_norms, e.nonfinite_norms) == (0, 1, 1)
    assert d.flags == ("nonfinite",) and d.first_flagged == (("nonfinite", 10),)
    assert "nonfinite" in e.flags and "vanishing" not in e.flags
    assert (math.isnan(e.grad_norm) if math.isnan(bad) else e.grad_norm == math.inf)
    table = report_table.format_run(run).splitlines()
    (row_e,) = [line for line in table if line.startswith("e ")]
    assert ("nan" if math.isnan(bad) else "inf") in row_e.split()
    assert "norm (1 step)" in row_e


@pytest.mark.parametrize(
    "latest, zero_fraction, nonfinite, expected",
    [
        (1.0, 0.0, 0, ()),
        (9e-4, 0.0, 0, ("vanishing",)),  # 9e-4 of the reference layer's 1.0
        (1e-3, 0.0, 0, ()),  # at the threshold: not flagged
        (2e3, 0.0, 0, ("exploding",)),
        (math.inf, 0.0, 0, ("nonfinite", "exploding")),
        (1.0, 0.99, 0, ("dead",)),
        (1.0, 0.98, 0, ()),
        (1e-5, 1.0, 3, ("nonfinite", "vanishing", "dead")),
    ],
)
def test_flags(latest, zero_fraction, nonfinite, expected):
    layers, _ = one_run(
        {
            "grad_norm/layer": series(1.0, 1.0, latest),
            "activation_zero_fraction/layer": series(0.0, 0.0, zero_fraction),
            "grad_nonfinite/layer": series(0.0, 0.0, nonfinite),
            "grad_norm/reference": series(1.0, 1.0, 1.0),
        }
    )
    assert layers["layer"].flags == expected


def test_thresholds_are_options():
    scalars = {"grad_norm/a": series(1.0, 1.0, 0.01), "grad_norm/b": series(1.0, 1.0, 1.0)}
    assert one_run(scalars)[0]["a"].flags == ()
    strict = report.HealthThresholds(vanishing_ratio=0.1, exploding_norm=0.5, dead_fraction=0.5)
    layers, _ = one_run(scalars, strict)
    assert layers["a"].flags == ("vanishing",) and layers["b"].flags == ("exploding",)


def test_only_runs_with_kgrad_tags_are_reported():
    logs = {
        "m/train": run_logs(epoch_loss=series(1.0, 0.5, 0.2)),
        "m/kgrad": run_logs(grad_norm__d=series(1.0, 1.0, 1.0)),
        "other/kgrad": run_logs(global__grad_norm=series(1.0, 1.0, 1.0)),
    }
    assert [run.run for run in report.health_report(logs)] == ["m/kgrad", "other/kgrad"]
    assert report.health_report({"m/train": logs["m/train"]}) == []


@pytest.mark.parametrize(
    "argument, value, match",
    [
        (
            "vanishing_ratio",
            0.0,
            r"`vanishing_ratio` must be a number in \(0, 1\). Received: vanishing_ratio=0.0",
        ),
        ("vanishing_ratio", 1.0, r"Received: vanishing_ratio=1.0. Example: vanishing_ratio=1e-3"),
        (
            "exploding_norm",
            -1,
            r"`exploding_norm` must be a number in \(0, inf\). Received: exploding_norm=-1",
        ),
        ("dead_fraction", 1.5, r"`dead_fraction` must be a number in \(0, 1\]. Received: dead_fraction=1.5"),
        ("dead_fraction", "high", r"Received: dead_fraction='high'"),
    ],
)
def test_threshold_errors(argument, value, match):
    with pytest.raises(ValueError, match=match):
        report.HealthThresholds(**{argument: value})


def test_health_report_rejects_other_thresholds():
    with pytest.raises(TypeError, match=r"Received: thresholds=\{'vanishing_ratio': 0.1\}"):
        report.health_report({}, {"vanishing_ratio": 0.1})


def test_format_report_names_thresholds_runs_and_problems():
    logs = {
        "bad/kgrad": run_logs(
            grad_norm__early=series(1e-7, 1e-7, 1e-7), grad_norm__late=series(1.0, 1.0, 1.0)
        ),
        "good/kgrad": run_logs(grad_norm__early=series(0.5, 0.5, 0.5)),
    }
    thresholds = report.HealthThresholds()
    text = report_table.format_report(report.health_report(logs, thresholds), thresholds)
    assert text.splitlines()[0] == (
        "Thresholds: vanishing: the layer's gradient norm 0 or < 0.001 x the largest layer's; "
        "exploding: gradient norm > 1000; dead: >= 99% zero activations; nonfinite: any NaN/Inf"
    )
    assert ("run 'bad/kgrad': 3 probes, steps 0..20; activation grad = L2 norm of dJ/d(layer output) "
            "(grad_norm/)") in text
    early = next(line for line in text.splitlines() if line.startswith("early  1.0e-07"))
    assert early.split() == ["early", "1.0e-07", "x1.00", "1.0e-07", "-", "-", "0", "VANISHING"]
    assert text.splitlines()[-1] == "PROBLEMS in 1 of 2 runs. bad/kgrad: early (vanishing)"
    healthy = report_table.format_report(report.health_report({"g": logs["good/kgrad"]}), thresholds)
    assert healthy.splitlines()[-1] == "OK: no layer flagged in 1 run."


def test_the_verdict_counts_many_flagged_layers_per_flag_and_names_the_first():
    scalars = {f"grad_norm/conv{i}": series(5e3) for i in range(9)}
    scalars.update({f"grad_norm/head{i}": series(1e-3) for i in range(2)})
    scalars["grad_nonfinite/conv8"] = series(2.0)
    thresholds = report.HealthThresholds()
    text = report_table.format_report(report.health_report({"k": {"scalars": scalars}}), thresholds)
    assert text.splitlines()[-1] == (
        "PROBLEMS in 1 of 1 runs. k: 8 layers exploding (conv0, conv1, conv2 and 5 more), "
        "1 layer nonfinite exploding (conv8), 2 layers vanishing (head0, head1)"
    )
    # The table above it still has every layer.
    assert sum(line.startswith(("conv", "head")) for line in text.splitlines()) == 11


def test_layers_with_only_vector_weights_are_set_beside_each_other_not_beside_kernels():
    # A BatchNormalization's gamma and beta norms (hundreds of numbers) against a
    # kernel's (millions): a ResNet50 at init flagged all 53 of its BN layers
    # "vanishing" at ~4e-4 of conv1's norm, with per-weight RMS gradients like the convs'.
    scalars = {
        "weight_grad_norm/conv/kernel": series(400.0, 600.0),
        "weight_grad_norm/bn/gamma": series(0.3, 0.3),
        "weight_grad_norm/bn/beta": series(0.4, 0.4),
        "weight_grad_norm/bn_dead/gamma": series(1e-4, 1e-5),  # vanished beside bn: flagged
        "weight_grad_norm/head/kernel": series(2.0, 3.0),
    }
    shapes = {"conv/kernel": (3, 3, 64, 64), "bn/gamma": (64,), "bn/beta": (64,)}
    shapes.update({"bn_dead/gamma": (64,), "head/kernel": (64, 10)})
    logs = {"kgrad": {"scalars": scalars, "histograms": {}, "weight_shapes": shapes}}
    (run,) = report.health_report(logs)
    rows = {layer.layer: layer for layer in run.layers}
    assert run.vector_only_layers == ("bn", "bn_dead")
    assert rows["bn"].ratio_to_max == 1.0 and rows["bn"].flags == ()
    assert rows["bn_dead"].ratio_to_max == pytest.approx(1e-5 / 0.5)
    assert rows["bn_dead"].flags == ("vanishing",)
    assert dict(rows["bn_dead"].first_flagged) == {"vanishing": 0}  # 1e-4 / 0.5 at step 0 already
    assert rows["head"].ratio_to_max == pytest.approx(3.0 / 600.0)
    text = report_table.format_run(run)
    assert text.splitlines()[0].endswith(
        "; / largest: beside the run's largest; of the 2 layers with only vector weights "
        "(normalization), beside the largest of those"
    )
    # Without shapes (logs of other writers, or of an older kgrad): one group, as before.
    del logs["kgrad"]["weight_shapes"]
    (old,) = report.health_report(logs)
    assert old.vector_only_layers == ()
    assert {layer.layer: layer.flags for layer in old.layers}["bn"] == ("vanishing",)
    assert "/ largest" not in report_table.format_run(old).splitlines()[0]


def test_update_ratio_of_a_layer_whose_weight_was_zero_is_only_given_where_the_logs_hold_it():
    # A weight at zero that moved is logged with ratio 1 ("all of its change"):
    # the size of its change is not in the logs.
    def ratio(kernel_norm, kernel_ratio, bias_ratio):
        layers, _ = one_run({
            "weight_grad_norm/m/d/kernel": series(1.0),
            "weight_grad_norm/m/d/bias": series(1.0),
            "weight_norm/m/d/kernel": series(kernel_norm),
            "weight_norm/m/d/bias": series(0.0),
            "update_ratio/m/d/kernel": series(kernel_ratio),
            "update_ratio/m/d/bias": series(bias_ratio),
        })
        return layers["m/d"].update_ratio

    assert math.isnan(ratio(2.0, 0.1, 1.0))  # beside a kernel that was not zero: unknown
    assert ratio(2.0, 0.1, 0.0) == pytest.approx(0.1)  # the zero bias did not move
    assert ratio(0.0, 1.0, 1.0) == 1.0  # every weight was zero and moved: the rule of one weight
    assert ratio(0.0, 0.0, 0.0) == 0.0


def test_a_layer_behind_a_zero_initialized_one_gets_update_ratios_and_a_trend_as_fit_moved_it(tmp_path):
    # `out` starts all zeros, so dJ/dw of `hidden` is exactly 0 at step 0; `hidden`'s
    # bias starts at zero beside a kernel that does not. Reference: the weights
    # before and after each step, read from the model by a callback.
    import base64

    import keras

    import kgrad
    from kgrad.dashboard import views

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, activation="tanh", name="hidden"),
        keras.layers.Dense(1, kernel_initializer="zeros", name="out"),
    ])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = np.ones((16, 1), "float32")
    before, after = [], []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: before.append(model.get_weights()),
        on_train_batch_end=lambda batch, logs: after.append(model.get_weights()),
    )
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=1, statistics="all")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[probe, record])

    def expected(layer_index, step):
        pairs = list(zip(before[step], after[step]))[2 * layer_index : 2 * layer_index + 2]
        norms = [np.linalg.norm(w) for w, _ in pairs]
        if any(n == 0 and np.any(w != v) for (w, v), n in zip(pairs, norms)) and any(norms):
            return math.nan  # a zero weight moved beside one that was not: not in the logs
        if not any(norms):
            return 1.0
        return np.sqrt(sum(np.sum((v - w) ** 2) for w, v in pairs)) / np.sqrt(sum(n**2 for n in norms))

    logs = kgrad.read_logs(str(tmp_path))
    heatmap = views.RunView("kgrad", logs["kgrad"]).heatmap("update_ratio")
    assert heatmap["layers"] == ["hidden", "out"] and heatmap["steps"] == [0, 1, 2, 3]
    matrix = np.frombuffer(base64.b64decode(heatmap["values"]), "<f4").reshape(2, 4)
    for layer_index in range(2):
        reference = [expected(layer_index, step) for step in range(4)]
        # Not in the logs: shown as not logged (NaN), never as a NaN/Inf value.
        np.testing.assert_allclose(matrix[layer_index], reference, rtol=1e-4)
    # Both cases occurred: the zero bias of `hidden` moved at step 1 (dJ/dw was 0 at step 0),
    # and every weight of `out` was zero at step 0.
    assert expected(0, 0) == 0.0 and math.isnan(expected(0, 1)) and expected(1, 0) == 1.0
    (run,) = kgrad.health_report(logs)
    hidden, out = run.layers
    assert hidden.update_ratio == pytest.approx(expected(0, 3), rel=1e-4)
    assert logs["kgrad"]["scalars"]["grad_norm/hidden"].values[0] == 0.0
    assert hidden.trend == math.inf
    line = next(line for line in report_table.format_report([run], kgrad.HealthThresholds()).splitlines()
                if line.startswith("hidden"))
    assert line.split()[2:4] == ["from", "0"] and len(line) < 100


def test_a_normalization_layer_is_first_flagged_when_it_vanishes_beside_its_peers_not_the_kernels():
    # bn_late's 0.2 at the first step is 5e-4 of the conv kernel's 400 (below the 1e-3
    # threshold) but 0.4 of its peer bn's 0.5: it vanishes only at the second step.
    scalars = {
        "weight_grad_norm/conv/kernel": series(400.0, 600.0),
        "weight_grad_norm/bn/gamma": series(0.3, 0.3),
        "weight_grad_norm/bn/beta": series(0.4, 0.4),
        "weight_grad_norm/bn_late/gamma": series(0.2, 1e-4),
    }
    shapes = {"conv/kernel": (3, 3, 64, 64), "bn/gamma": (64,), "bn/beta": (64,), "bn_late/gamma": (64,)}
    logs = {"kgrad": {"scalars": scalars, "histograms": {}, "weight_shapes": shapes}}
    (run,) = report.health_report(logs)
    rows = {layer.layer: layer for layer in run.layers}
    assert rows["bn_late"].flags == ("vanishing",)
    assert dict(rows["bn_late"].first_flagged) == {"vanishing": int(series(0.0, 0.0).steps[1])}
