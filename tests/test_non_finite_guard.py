"""NonFiniteGuard: injected faults are located at the right layer and step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from kgrad.backends.common import attached
from kgrad.plan.tag_names import MOMENT_NAMES
import kgrad.backends.tensorflow.summarize.stats
from fit_helpers import guard_data, middle_model, sqrt_at_zero_loss

BATCH = 4


def _fit(model, x, y, guard, jit_compile=False, steps_per_execution=1, epochs=1):
    model.compile(
        keras.optimizers.SGD(0.01),
        "mse",
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model.fit(
        x, y, batch_size=BATCH, epochs=epochs, shuffle=False, callbacks=[guard], verbose=0
    )


def _tanh_model():
    return middle_model(lambda t: keras.ops.tanh(t))


def _assert_weights_of_plain_fit(model, make_model, initial, x, y, jit_compile=False):
    """``model`` holds the weights that plain ``fit`` from ``initial`` on ``x, y`` gives."""
    plain = make_model()
    plain.set_weights(initial)
    _fit(plain, x, y, keras.callbacks.Callback(), jit_compile=jit_compile)
    for got, want in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)
    return plain


def _sqrt_at_zero_model():
    """`root` is sqrt of zeros: finite forward, an infinite derivative in the backward pass."""
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, name="first"),
            keras.layers.Lambda(lambda t: keras.ops.relu(t) * 0.0, name="zeros"),
            keras.layers.Lambda(lambda t: keras.ops.sqrt(t), name="root"),
            keras.layers.Dense(1, name="out"),
        ]
    )


@pytest.mark.parametrize("jit_compile", [False, True])
def test_nan_born_in_the_loss_gradient_is_reported_as_prediction_gradient(jit_compile):
    x, y = guard_data()
    y[8:12] = 1000.0  # batch 2 turns on the sqrt-at-zero term of the loss

    loss = sqrt_at_zero_loss
    model = middle_model(lambda t: keras.ops.tanh(t))
    model.compile(keras.optimizers.SGD(0.01), loss, jit_compile=jit_compile)
    guard = kgrad.NonFiniteGuard(watch="all")
    model.fit(x, y, batch_size=BATCH, shuffle=False, callbacks=[guard], verbose=0)
    report = guard.report
    # dJ/dŷ is computed on the tripped step only; it comes first from the loss down.
    assert (report.step, report.pass_, report.kind, report.layer) == (2, "backward", "pred_grad", "output")
    assert report.nan_count == BATCH and report.last_finite_step == 1
    assert report.last_finite_norm is None  # not computed on clean steps
    assert "The last finite step was 1." in str(report)
    assert "grad/out" in report.non_finite and "weight_grad/out/kernel" in report.non_finite


def test_guard_flag_stays_out_of_the_logs_keras_and_callbacks_see():
    x, y = guard_data()
    seen = []
    recorder = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(set(logs)))
    model = middle_model(lambda t: keras.ops.tanh(t))
    model.compile(keras.optimizers.SGD(0.01), "mse")
    history = model.fit(x, y, batch_size=BATCH, callbacks=[kgrad.NonFiniteGuard(), recorder], verbose=0)
    assert seen and all(keys == {"loss"} for keys in seen)
    assert set(history.history) == {"loss"}


@pytest.mark.parametrize("jit_compile", [False, True])
def test_bad_batch_is_reported_as_input_and_update_skipped(jit_compile):
    x, y = guard_data()
    x[13, 1] = np.nan  # batch 3
    model = middle_model(lambda t: keras.ops.tanh(t))
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(watch="all")
    _fit(model, x, y, guard, jit_compile=jit_compile)
    report = guard.report
    assert (report.step, report.kind, report.nan_count) == (3, "input", 1)
    assert report.last_finite_step == 2
    # The weights are those after the three clean steps: the bad one was not applied.
    _assert_weights_of_plain_fit(model, _tanh_model, initial, x[:12], y[:12], jit_compile)
    assert all(np.isfinite(w).all() for w in model.get_weights())


def _masked_log_model():
    """`log` makes NaN for negative inputs; `mask` zeroes them before they reach anything."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, name="first"),
            keras.layers.Lambda(lambda t: keras.ops.log(t), name="log"),
            keras.layers.Lambda(
                lambda t: keras.ops.where(keras.ops.isnan(t), keras.ops.zeros_like(t), t),
                name="mask",
            ),
            keras.layers.Dense(1, name="out"),
        ]
    )
    model.build((None, 3))
    # Units 0-1 see x - 1 (negative for some samples), units 2-3 see x + 1.
    kernel = np.concatenate([np.eye(3, 2), np.eye(3, 2)], axis=1).astype("float32")
    model.get_layer("first").set_weights([kernel, np.array([-1, -1, 1, 1], "float32")])
    return model


@pytest.mark.parametrize("jit_compile", [False, True])
def test_watch_weight_gradients_ignores_nan_that_cannot_reach_the_weights(jit_compile):
    x, y = guard_data()
    masked = _masked_log_model()
    initial = masked.get_weights()
    every_kind = kgrad.NonFiniteGuard(layers="all", watch="all")
    _fit(masked, x, y, every_kind, jit_compile=jit_compile)
    # The default watch trips on the NaN activation of `log` (forward order).
    assert (every_kind.report.step, every_kind.report.kind, every_kind.report.layer) == (
        0, "activation", "log",
    )
    model = _masked_log_model()
    guard = kgrad.NonFiniteGuard(watch=["weight_gradients"], layers="all")
    _fit(model, x, y, guard, jit_compile=jit_compile)
    assert guard.report is None
    # It trained like plain fit: the NaN never reached a weight.
    _assert_weights_of_plain_fit(model, _masked_log_model, initial, x, y, jit_compile)
    assert all(np.isfinite(w).all() for w in model.get_weights())


@pytest.mark.parametrize("jit_compile", [False, True])
def test_watch_weight_gradients_skips_an_update_that_would_be_non_finite(jit_compile):
    x, y = guard_data()
    x[13, 1] = np.nan  # batch 3: the loss and every weight gradient are NaN
    model = middle_model(lambda t: keras.ops.tanh(t))
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(watch=["weight_gradients"])
    _fit(model, x, y, guard, jit_compile=jit_compile)
    report = guard.report
    # The input is not watched: the loss, always checked, is the first
    # non-finite tensor in forward order; the weight gradients follow.
    assert (report.step, report.kind, report.pass_) == (3, "loss", "forward")
    assert "input/input" not in report.non_finite
    assert {"weight_grad/out/kernel", "weight_grad/first/kernel"} <= set(report.non_finite)
    assert report.last_finite_step == 2
    _assert_weights_of_plain_fit(model, _tanh_model, initial, x[:12], y[:12], jit_compile)


def test_watch_weight_gradients_finds_nan_born_in_the_backward_pass():
    x, y = guard_data()
    model = _sqrt_at_zero_model()
    guard = kgrad.NonFiniteGuard(watch=["weight_gradients"], layers="all")
    _fit(model, x, y, guard)
    report = guard.report
    # The loss is finite; d sqrt/dt at 0 is infinite and reaches `first`'s weights.
    assert (report.step, report.pass_, report.kind) == (0, "backward", "weight_grad")
    assert report.layer.startswith("first/")
    assert not any(name.startswith(("grad/", "activation/")) for name in report.non_finite)


def test_steps_per_execution_stops_updates_after_the_bad_step():
    x, y = guard_data()
    x[21, 0] = np.inf  # batch 5, inside the second execution of 4 steps
    model = middle_model(lambda t: keras.ops.tanh(t))
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(watch="all")
    _fit(model, x, y, guard, steps_per_execution=4)
    assert (guard.report.step, guard.report.kind) == (5, "input")
    # The steps after the trip in the same execution update nothing and do
    # not count as finite steps.
    assert guard.report.last_finite_step == 4
    _assert_weights_of_plain_fit(model, _tanh_model, initial, x[:20], y[:20])


def _huge_middle_model():
    """An activation of ~1e20: finite, but its squares overflow float32."""
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, name="first"),
            keras.layers.Lambda(lambda t: t * 1e20, name="huge"),
            keras.layers.Lambda(lambda t: t * 1e-20, name="back"),
            keras.layers.Dense(1, name="out"),
        ]
    )


@pytest.mark.parametrize("jit_compile", [False, True])
def test_finite_values_whose_squares_overflow_are_no_alarm_and_train(jit_compile):
    x, y = guard_data()
    model = _huge_middle_model()
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    _fit(model, x, y, guard, jit_compile=jit_compile)
    assert guard.report is None
    plain = _assert_weights_of_plain_fit(model, _huge_middle_model, initial, x, y, jit_compile)
    assert int(model.optimizer.iterations) == int(plain.optimizer.iterations) == len(x) // BATCH


@pytest.mark.parametrize("jit_compile", [False, True])
def test_clean_run_raises_no_alarm_and_trains_like_plain_fit(jit_compile):
    x, y = guard_data()
    model = middle_model(lambda t: keras.ops.tanh(t))
    initial = model.get_weights()
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    history = _fit(model, x, y, guard, jit_compile=jit_compile, epochs=2)
    assert guard.report is None and guard.reports == []
    plain = middle_model(lambda t: keras.ops.tanh(t))
    plain.set_weights(initial)
    plain_history = _fit(plain, x, y, keras.callbacks.Callback(), jit_compile=jit_compile, epochs=2)
    assert history.history == plain_history.history
    for got, want in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_warn_reports_every_bad_step_and_continues():
    x, y = guard_data()
    x[1, 0] = np.nan
    x[9, 0] = np.nan
    model = middle_model(lambda t: keras.ops.tanh(t))
    guard = kgrad.NonFiniteGuard(action="warn")
    with pytest.warns(RuntimeWarning, match="Non-finite values at step"):
        _fit(model, x, y, guard)
    # Steps are optimizer.iterations, which skipped updates do not advance:
    # batches 0 and 2 are bad, and batch 2 runs at iteration 1.
    assert [report.step for report in guard.reports] == [0, 1]
    assert model.optimizer.iterations.numpy() == len(x) // BATCH - 2
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_raise_gives_structured_error_and_restores_model():
    x, y = guard_data()
    x[5, 2] = np.nan
    model = middle_model(lambda t: keras.ops.tanh(t))
    guard = kgrad.NonFiniteGuard(action="raise")
    with pytest.raises(kgrad.NonFiniteError, match="step 1") as error:
        _fit(model, x, y, guard)
    # The sentinel saw the loss; the replay says the NaN came with the data.
    assert (error.value.report.kind, error.value.report.born_in) == ("loss", "data")
    assert "train_step" not in model.__dict__
    # The model trains normally afterwards, without the guard.
    model.fit(x[8:], y[8:], batch_size=BATCH, verbose=0)


@pytest.mark.parametrize("bad", ["target", "sample_weight"])
def test_a_nan_in_one_output_s_target_or_weights_is_named_by_that_output(bad):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    outputs = {
        "cls": keras.layers.Dense(3, activation="softmax", name="cls")(hidden),
        "reg": keras.layers.Dense(1, name="reg")(hidden),
    }
    model = keras.Model(inputs, outputs)
    model.compile("sgd", loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"})
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = {"cls": rng.integers(0, 3, 32), "reg": rng.normal(size=(32, 1)).astype("float32")}
    weights = {"cls": np.ones(32, "float32"), "reg": np.ones(32, "float32")}
    (y if bad == "target" else weights)["reg"][13] = np.nan
    guard = kgrad.NonFiniteGuard(action="warn")
    with pytest.warns(RuntimeWarning, match=f"arrived with the input data at '{bad}/reg'"):
        model.fit(x, y, sample_weight=weights, batch_size=8, shuffle=False, verbose=0,
                  callbacks=[guard])
    (report,) = guard.reports
    assert (report.step, report.batch_index, report.born_in, report.born_at) == (1, 1, "data", f"{bad}/reg")
    assert (report.born_nan_count, report.born_inf_count) == (1, 0)


def test_guard_with_probe_reports_last_probed_summaries():
    x, y = guard_data()
    x[17, 0] = np.nan  # batch 4
    model = middle_model(lambda t: keras.ops.tanh(t))
    model.compile(keras.optimizers.SGD(0.01), "mse")
    guard = kgrad.NonFiniteGuard(watch="all")
    probe = kgrad.GradientProbe(every_n_steps=2, statistics="all")
    model.fit(x, y, batch_size=BATCH, shuffle=False, callbacks=[probe, guard], verbose=0)
    report = guard.report
    assert (report.step, report.kind, report.layer) == (4, "input", "input")
    # From probed step 2, the last finite one (step 4 was probed too, and bad).
    assert report.last_summaries["input_grad_nonfinite/input"] == 0.0
    assert set(report.last_summaries) == {f"input_grad_{stat}/input" for stat in MOMENT_NAMES}
    assert probe.latest.step == 4
    assert "train_step" not in model.__dict__ and attached.get(model, "installation") is None


def test_guard_with_probe_last_summaries_of_layer():
    x, y = guard_data()
    x[8:12] *= 200.0
    model = middle_model(lambda t: keras.ops.exp(t), name="exp")
    model.build((None, 3))
    model.get_layer("first").set_weights([np.eye(3, 4, dtype="float32"), np.zeros(4, "float32")])
    model.compile(keras.optimizers.SGD(0.0), "mse")
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    probe = kgrad.GradientProbe(layers="all", every_n_steps=1, statistics="all")
    model.fit(x, y, batch_size=BATCH, shuffle=False, callbacks=[probe, guard], verbose=0)
    assert (guard.report.step, guard.report.layer) == (2, "exp")
    assert guard.report.last_summaries["activation_norm/exp"] == pytest.approx(
        guard.report.last_finite_norm, rel=1e-5
    )


def test_mixed_precision_loss_scale_skips_are_not_alarms():
    x, y = guard_data(samples=64)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = middle_model(lambda t: keras.ops.tanh(t))
        # A huge initial scale overflows the float16 backward pass: the loss
        # scaler skips those steps and halves its scale, as designed.
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**20)
        model.compile(optimizer, "mse")
        guard = kgrad.NonFiniteGuard()
        model.fit(x, y, batch_size=BATCH, callbacks=[guard], verbose=0)
        assert guard.report is None
        assert 0 < model.optimizer.iterations.numpy() < len(x) // BATCH  # some steps skipped
        strict_model = middle_model(lambda t: keras.ops.tanh(t))
        strict_model.compile(
            keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**20), "mse"
        )
        strict = kgrad.NonFiniteGuard(ignore_loss_scale_skips=False)
        strict_model.fit(x, y, batch_size=BATCH, callbacks=[strict], verbose=0)
        assert strict.report is not None and strict.report.pass_ == "backward"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_first_non_finite_on_probe_tape_result():
    model = middle_model(lambda t: keras.ops.sqrt(t), name="root")
    x = tf.constant([[1.0, 2.0, 3.0]])
    with kgrad.ProbeTape(model, layers="all", watch_inputs=True) as tape:
        loss = tf.reduce_sum(model(x))
    tape.gradient(loss, model.trainable_variables)
    assert kgrad.first_non_finite(tape.probe) is None or model.get_layer("first")(x).numpy().min() <= 0
    with kgrad.ProbeTape(model, layers="all") as tape:
        loss = tf.reduce_sum(model(tf.constant([[1.0, np.nan, 3.0]])))
    tape.gradient(loss, model.trainable_variables)
    report = kgrad.first_non_finite(tape.probe, step=7)
    assert (report.step, report.kind, report.layer, report.nan_count) == (7, "input", "input", 1)
    model.get_layer("first").set_weights([-np.eye(3, 4, dtype="float32"), np.zeros(4, "float32")])
    with kgrad.ProbeTape(model, layers="all") as tape:
        loss = tf.reduce_sum(model(x))
    tape.gradient(loss, model.trainable_variables)
    report = kgrad.first_non_finite(tape.probe)
    assert (report.kind, report.layer, report.pass_, report.nan_count) == ("activation", "root", "forward", 3)


def test_first_non_finite_refuses_graph_mode():
    model = middle_model(lambda t: t)
    model.build((None, 3))

    @tf.function
    def step(x):
        with kgrad.ProbeTape(model) as tape:
            loss = tf.reduce_sum(model(x))
        tape.gradient(loss, model.trainable_variables)
        return kgrad.first_non_finite(tape.probe)

    with pytest.raises(RuntimeError, match="must run eagerly"):
        step(tf.ones((1, 3)))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"action": "explode"}, r"`action` must be one of .* Received: action='explode'"),
        ({"watch": ["nothing"]}, r"`watch` must be a non-empty subset .* Received: watch=\['nothing'\]"),
        ({"watch": 3}, r"`watch` must be 'all' or a list"),
        ({"ignore_loss_scale_skips": "yes"}, r"`ignore_loss_scale_skips` must be True or False"),
        ({"replay": "yes"}, r"`replay` must be True or False. Received: replay='yes'"),
        ({"dump_dir": 3}, r"`dump_dir` must be None or a folder path .* Received: dump_dir=3 of type int"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        kgrad.NonFiniteGuard(**kwargs)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_sentinel_beside_a_probe_trains_unchanged_and_stops_on_an_unprobed_step(jit_compile):
    # With a probe every 3 steps, a clean run trains like plain fit, and a
    # NaN on an unprobed step (4) trips the sentinel and keeps the update out.
    x, y = guard_data()
    model = _tanh_model()
    initial = model.get_weights()
    clean = _tanh_model()
    clean_probe = kgrad.GradientProbe(every_n_steps=3)
    clean.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=jit_compile)
    clean.fit(
        x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[clean_probe, kgrad.NonFiniteGuard()]
    )
    _assert_weights_of_plain_fit(clean, _tanh_model, initial, x, y, jit_compile=jit_compile)
    assert clean_probe.latest.step == 6

    x[17, 0] = np.nan  # batch 4, not probed
    probe, guard = kgrad.GradientProbe(every_n_steps=3), kgrad.NonFiniteGuard()
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=jit_compile)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe, guard])
    assert guard.report.step == 4 and guard.report.born_in == "data"
    _assert_weights_of_plain_fit(model, _tanh_model, initial, x[:16], y[:16], jit_compile=jit_compile)
    assert probe.latest.step == 3
