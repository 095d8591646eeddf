"""NonFiniteGuard's replay: injected faults are named at the exact layer or op, and step."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from kgrad.backends.tensorflow.guard.locate import locate
from fit_helpers import sqrt_at_zero_loss

BATCH = 4
BAD_ROW = 9  # in batch 2, i.e. step 2 of the first epoch


def _data(samples=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 1.5, size=(samples, 3)).astype("float32")
    y = rng.normal(size=(samples, 1)).astype("float32")
    return x, y


def _first():
    """A Dense layer that passes x through (units 0-2) and a constant 1 (unit 3), exactly."""
    layer = keras.layers.Dense(4, name="first", trainable=False)
    layer.build((None, 3))
    layer.set_weights([np.eye(3, 4, dtype="float32"), np.array([0, 0, 0, 1], "float32")])
    return layer


def _sequential(*middle):
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((3,)), _first(), *middle, keras.layers.Dense(1, name="out")])


def _fit(model, x, y, jit_compile, guard=None, steps_per_execution=1, **fit_kwargs):
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=jit_compile,
                  steps_per_execution=steps_per_execution)
    guard = guard or kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, callbacks=[guard], verbose=0, **fit_kwargs)
    return guard.report


def _born(report):
    return (report.step, report.born_in, report.born_at, report.born_type)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_minus_inf_from_log_in_a_lambda_between_two_dense_layers(jit_compile):
    x, y = _data()
    x[BAD_ROW, 0] = 0.0
    report = _fit(_sequential(keras.layers.Lambda(keras.ops.log, name="middle")), x, y, jit_compile)
    assert _born(report) == (2, "forward", "middle", "Lambda")
    assert (report.born_nan_count, report.born_inf_count, report.batch_index) == (0, 1, 2)
    assert report.born_input_range[0] == 0.0 and report.replayed
    assert report.kind == "loss"  # what the sentinel saw
    assert "born in the forward pass at 'middle' (Lambda" in str(report)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_nan_from_sqrt_op_node_of_a_functional_graph(jit_compile):
    x, y = _data()
    x[BAD_ROW, 1] = -1.0
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(1, name="out")(keras.ops.sqrt(_first()(inputs)))
    model = keras.Model(inputs, outputs)
    sqrt = next(op.name for op in model.operations if type(op).__name__ == "Sqrt")  # "sqrt", "sqrt_1"...
    report = _fit(model, x, y, jit_compile)
    assert _born(report) == (2, "forward", sqrt, "Sqrt")
    assert (report.born_nan_count, report.born_inf_count) == (1, 0)
    assert report.born_input_range == (-1.0, pytest.approx(x[8:12].max()))


class Ratio(keras.layers.Layer):
    """t / (t - 2): a division by zero where t == 2."""

    def __init__(self, use_tap=False, **kwargs):
        super().__init__(**kwargs)
        self.use_tap = use_tap

    def call(self, t):
        ratio = t / (t - 2.0)
        return kgrad.tap("ratio", ratio) if self.use_tap else ratio


@pytest.mark.parametrize("use_tap", [False, True])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_division_by_zero_inside_a_custom_layer(jit_compile, use_tap):
    x, y = _data()
    x[BAD_ROW, 2] = 2.0
    report = _fit(_sequential(Ratio(use_tap, name="ratio_layer")), x, y, jit_compile)
    assert _born(report) == (2, "forward", "ratio_layer", "Ratio")
    assert report.born_inf_count == 1
    assert report.born_inside == ("ratio" if use_tap else None)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_inf_from_overflowing_exp_in_an_activation_layer(jit_compile):
    x, y = _data()
    x[8:12] *= 200.0
    report = _fit(_sequential(keras.layers.Activation("exponential", name="exp")), x, y, jit_compile)
    assert _born(report) == (2, "forward", "exp", "Activation")
    assert report.born_inf_count > 0 and report.born_nan_count == 0
    assert report.born_input_range[1] == pytest.approx(x[8:12].max())
    assert report.last_finite_step == 1


@pytest.mark.parametrize("jit_compile", [False, True])
def test_nan_born_only_in_the_backward_pass_of_sqrt_at_zero(jit_compile):
    x, y = _data()
    zeros = keras.layers.Lambda(lambda t: keras.ops.relu(t) * 0.0, name="zeros")
    root = keras.layers.Lambda(lambda t: keras.ops.sqrt(t), name="root")
    report = _fit(_sequential(keras.layers.Dense(4, name="hidden"), zeros, root), x, y, jit_compile)
    # sqrt(0) = 0 is finite; its derivative at 0 is not.
    assert _born(report) == (0, "backward", "root", "Lambda")
    assert report.born_input_range == (0.0, 0.0)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_nan_in_one_input_value_arrived_with_the_data(jit_compile):
    x, y = _data()
    bad = x.copy()
    bad[BAD_ROW, 1] = np.nan

    def batches():  # epoch 0 clean, epoch 1 with the NaN in its batch 2
        for epoch_x in (x, bad):
            for start in range(0, len(x), BATCH):
                yield epoch_x[start:start + BATCH], y[start:start + BATCH]

    model = _sequential(keras.layers.Activation("tanh", name="tanh"))
    report = _fit(model, batches(), None, jit_compile, epochs=2, steps_per_epoch=len(x) // BATCH)
    assert _born(report) == (10, "data", "input", "input data")
    assert (report.batch_index, report.born_nan_count) == (2, 1)
    assert "arrived with the input data" in str(report) and "Batch 2 of the epoch" in str(report)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_learning_rate_so_large_that_a_weight_overflows(jit_compile):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False, name="out")])
    # Adam moves each weight by ~lr a step, the loss mean(ŷ) always the same
    # way: -1e38, -2e38, -3e38, then -inf after the update of step 3, while
    # every gradient is finite.
    model.compile(keras.optimizers.Adam(1e38), lambda y_true, y_pred: keras.ops.mean(y_pred),
                  jit_compile=jit_compile)
    guard = kgrad.NonFiniteGuard()
    x = np.full((32, 3), 1e-3, "float32")
    model.fit(x, np.zeros((32, 1)), batch_size=BATCH, shuffle=False, callbacks=[guard], verbose=0)
    report = guard.report
    assert (report.step, report.born_in, report.born_step) == (4, "weights", 3)
    assert report.born_at.endswith("out/kernel") and report.born_inf_count == 3
    assert report.last_finite_norm is None  # its squares overflowed: unknown, not Inf


@pytest.mark.parametrize("jit_compile", [False, True])
def test_clean_run_raises_no_alarm_and_trains_like_plain_fit(jit_compile):
    x, y = _data()
    make = lambda: _sequential(keras.layers.Activation("tanh", name="tanh"))  # noqa: E731
    guarded, plain = make(), make()
    plain.set_weights(guarded.get_weights())
    guard = kgrad.NonFiniteGuard()
    assert _fit(guarded, x, y, jit_compile, guard, epochs=2) is None
    plain.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=jit_compile)
    plain.fit(x, y, batch_size=BATCH, shuffle=False, epochs=2, verbose=0)
    for got, want in zip(guarded.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert guard.reports == [] and "train_step" not in guarded.__dict__


@pytest.mark.parametrize("jit_compile", [False, True])
def test_with_warn_each_trip_replays_its_own_batch(jit_compile):
    x, y = _data()
    x[BAD_ROW, 0] = 0.0  # batch 2
    x[21, 2] = 0.0  # batch 5
    model = _sequential(keras.layers.Lambda(keras.ops.log, name="middle"))
    guard = kgrad.NonFiniteGuard(action="warn")
    with pytest.warns(RuntimeWarning, match="Non-finite values at step"):
        _fit(model, x, y, jit_compile, guard=guard)
    # Skipped updates do not advance the step: batch 5 runs at step 4.
    assert [(r.step, r.batch_index) for r in guard.reports] == [(2, 2), (4, 5)]
    assert [_born(r) for r in guard.reports] == [
        (2, "forward", "middle", "Lambda"), (4, "forward", "middle", "Lambda"),
    ]
    assert all(r.replayed and r.born_inf_count == 1 for r in guard.reports)


def test_a_replay_that_does_not_reproduce_the_trip_says_so():
    x, y = _data()
    armed = tf.Variable(1.0)  # 0 on step 2 only: 0/0 there, never in the replay
    model = _sequential(keras.layers.Lambda(lambda t: t * armed / armed, name="flaky"))
    arm = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: armed.assign(0.0 if batch == 2 else 1.0),
        on_train_batch_end=lambda batch, logs: armed.assign(1.0),
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, callbacks=[arm, guard], verbose=0)
    report = guard.report
    assert (report.step, report.replayed, report.born_in, report.kind) == (2, False, None, "loss")
    assert "did not reproduce the trip" in str(report)


def test_first_non_finite_gives_the_same_born_where_answer_for_probe_tape_users():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(keras.ops.sqrt(_first()(inputs))))
    with kgrad.ProbeTape(model, layers="all", record_inputs=True) as tape:
        loss = tf.reduce_sum(model(tf.constant([[1.0, -1.0, 1.0]])))
    tape.gradient(loss, model.trainable_variables)
    report = kgrad.first_non_finite(tape.probe, model=model)
    sqrt = next(op.name for op in model.operations if type(op).__name__ == "Sqrt")
    born = (report.born_in, report.born_at, report.born_type, report.born_nan_count)
    assert born == ("forward", sqrt, "Sqrt", 1)
    assert report.layer == sqrt  # the first non-finite tensor, as before
    assert locate(tape.probe, model, loss)["born_at"] == sqrt


def test_dump_reproduces_the_trip_in_a_fresh_process(preloaded_python, tmp_path):
    x, y = _data()
    x[8:12] *= 200.0
    # Built-in layers only: a Lambda's function must be importable where it is loaded.
    model = _sequential(keras.layers.Activation("exponential", name="exp"))
    report = _fit(model, x, y, False, kgrad.NonFiniteGuard(dump_dir=tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["step_2.keras", "step_2.npz"]
    assert report.reproduce.count("\n") == 2 and report.reproduce in str(report)
    # The batch as it was: exactly the rows of step 2.
    np.testing.assert_array_equal(np.load(tmp_path / "step_2.npz")["x"], x[8:12])
    # As `python -c` would run it, in a fresh process (a fork of one that imported Keras and kgrad).
    status, stdout, stderr = preloaded_python.run_blocks([("reproduce", report.reproduce)], tmp_path, timeout=120)
    assert status == 0, stderr[-2000:]
    assert "born in the forward pass at 'exp' (Activation" in stdout
    assert "at step 2" in stdout


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_layer_of_a_nested_model_is_named_with_its_path(jit_compile):
    x, y = _data()
    x[BAD_ROW, 0] = 0.0
    log = keras.layers.Lambda(keras.ops.log, name="middle")
    inner = keras.Sequential([keras.Input((4,)), log], name="sub")
    report = _fit(_sequential(inner), x, y, jit_compile)
    assert _born(report) == (2, "forward", "middle", "Lambda")
    assert report.born_path == "sub/middle"


def test_a_dump_that_cannot_be_written_is_said_and_the_report_kept(tmp_path):
    x, y = _data()
    x[BAD_ROW, 0] = 0.0
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    model = _sequential(keras.layers.Lambda(keras.ops.log, name="middle"))
    report = _fit(model, x, y, False, kgrad.NonFiniteGuard(dump_dir=blocker))
    assert (report.born_at, report.reproduce) == ("middle", None)
    assert "Not dumped: the batch could not be written" in report.replay_note


@pytest.mark.parametrize("jit_compile", [False, True])
def test_nan_born_in_the_backward_pass_of_the_loss(jit_compile):
    x, y = _data()
    y[8:12] = 1000.0  # batch 2 turns on the sqrt-at-zero term of the loss

    loss = sqrt_at_zero_loss
    model = _sequential(keras.layers.Dense(4, name="hidden"))
    model.compile(keras.optimizers.SGD(0.01), loss, jit_compile=jit_compile)
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, callbacks=[guard], verbose=0)
    report = guard.report
    # The forward pass and dJ/dŷ's inputs are finite; dJ/dŷ is not: born in the loss's backward pass.
    assert _born(report) == (2, "backward", "loss", "loss")
    assert report.born_nan_count == BATCH


def test_an_output_whose_input_was_already_non_finite_is_named_as_carrying_it():
    from kgrad.backends.tensorflow.capture.probe_result import ProbeResult

    bad = tf.constant([1.0, np.inf])
    probe = ProbeResult(activations={"scale": bad * 2.0}, gradients={}, input=None, input_gradient=None,
                        prediction=None, layer_inputs={"scale": bad})
    born = locate(probe)
    assert (born["born_in"], born["born_at"], born["born_inf_count"], born["born_input_range"]) == (
        "forward", "scale", 1, (1.0, 1.0)
    )
    assert "born before 'scale'" in born["replay_note"]


def test_the_replay_changes_no_weight_statistic_or_metric():
    from kgrad.backends.tensorflow.guard.replay import replay_fields

    x, y = _data()
    x[BAD_ROW, 0] = 0.0
    inputs = keras.Input((3,))
    logs = keras.layers.Lambda(keras.ops.log, name="middle")(_first()(inputs))
    hidden = keras.layers.BatchNormalization(name="norm")(logs)
    heads = [keras.layers.Dense(1, name=name)(hidden) for name in ("a", "b")]
    model = keras.Model(inputs, heads)
    model.compile(keras.optimizers.SGD(0.01), ["mse", "mse"])
    model.fit(x[:8], [y[:8], y[:8]], batch_size=BATCH, verbose=0)  # builds metrics and statistics
    before = [v.numpy().copy() for v in [*model.variables, *model.metrics_variables]]
    born, note = replay_fields(model, (x[8:12], (y[8:12], y[8:12])))
    assert (born["born_in"], born["born_at"], note) == ("forward", "middle", None)
    for was, variable in zip(before, [*model.variables, *model.metrics_variables]):
        np.testing.assert_array_equal(variable.numpy(), was)


@pytest.mark.parametrize("jit_compile,steps_per_execution", [(False, 1), (True, 1), (False, 3), (True, 3)])
def test_a_dropout_mask_that_makes_the_nan_is_drawn_again_by_the_replay(jit_compile, steps_per_execution):
    # log(Dropout(x)) is -inf wherever the mask drops a unit: which step
    # trips, and where, depends on the masks drawn; the replay must draw the
    # tripped step's own (the layer's seed generator has moved on since).
    x, y = _data()
    model = _sequential(keras.layers.Dropout(0.03, seed=3, name="drop"),
                        keras.layers.Lambda(keras.ops.log, name="middle"))
    report = _fit(model, x, y, jit_compile, steps_per_execution=steps_per_execution)
    if jit_compile:
        # XLA picks its own random algorithm: the eager replay draws another mask, and says so.
        assert report.replayed is False and "ran under XLA" in report.replay_note
        assert "'drop'" in report.replay_note and "did not reproduce the trip" in report.replay_note
        return
    assert report.step > 0  # not the first step, so the generator had moved on
    assert (report.replayed, report.born_in, report.born_at, report.born_input_range[0]) == (
        True, "forward", "middle", 0.0
    )
    # As many -inf as units the tripped step's mask dropped, counted from that mask.
    dropout, first = keras.layers.Dropout(0.03, seed=3), _first()
    dropped = [
        int((dropout(first(x[i:i + BATCH]), training=True).numpy() == 0).sum())
        for i in range(0, len(x), BATCH)
    ]
    assert dropped[report.step] == report.born_inf_count > 0 and not any(dropped[:report.step])

