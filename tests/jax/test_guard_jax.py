"""kgrad.NonFiniteGuard on Keras' JAX backend: the sentinel in the jitted step, the kept state, the replay.

Every NaN here is planted in one batch of a real ``model.fit``; the weights
the guard keeps are compared with those of a plain ``fit`` on the clean
batches before it (same initial weights), and the counts of the report with
NumPy's.
"""

import warnings

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad
from kgrad.backends.common import attached
from kgrad.backends.jax.guard.sentinel import guard_apply, guard_update, initial_record
from kgrad.dashboard import events
from test_one_per_fit import test_two_guards_on_one_model_is_an_error  # noqa: F401 (run on JAX too)
from kgrad.dashboard.events import guard_reports

BATCH = 4


class Normalize(keras.layers.Layer):
    """Divides by the row sum: 0 / 0 on an all-zero row (a NaN born inside a custom layer)."""

    def call(self, inputs):
        return inputs / keras.ops.sum(inputs, axis=-1, keepdims=True)


def _positive_data(batches, bad_batch, bad_value, features=3):
    rng = np.random.RandomState(0)
    x = rng.uniform(0.5, 1.5, size=(batches * BATCH, features)).astype("float32")
    y = rng.normal(size=(batches * BATCH, 1)).astype("float32")
    if bad_batch is not None:
        x[bad_batch * BATCH + 1] = bad_value
    return x, y


def _model(birthplace):
    """``(model, bad input row, expected born_at, born_type, born_in)`` for each weightless birthplace."""
    inputs = keras.Input((3,), name="features")
    if birthplace == "lambda_sqrt_forward":  # sqrt of a negative input
        hidden = keras.layers.Lambda(lambda t: keras.ops.sqrt(t), name="root")(inputs)
        expected = (-1.0, "root", "Lambda", "forward")
    elif birthplace == "op_log_forward":  # a Functional op node: log(0) = -inf
        hidden = keras.ops.log(inputs)
        expected = (0.0, None, "Log", "forward")
    elif birthplace == "custom_divide_forward":  # 0 / 0 inside a custom layer
        hidden = Normalize(name="normalize")(inputs)
        expected = (0.0, "normalize", "Normalize", "forward")
    elif birthplace == "lambda_sqrt_backward":  # sqrt(0) = 0 is finite; its gradient is not
        hidden = keras.layers.Dense(4, use_bias=False, kernel_initializer="ones", name="hidden")(inputs)
        hidden = keras.layers.Lambda(lambda t: keras.ops.sqrt(t), name="root")(hidden)
        expected = (0.0, "root", "Lambda", "backward")
    elif birthplace == "op_sqrt_backward":
        hidden = keras.layers.Dense(4, use_bias=False, kernel_initializer="ones", name="hidden")(inputs)
        hidden = keras.ops.sqrt(hidden)
        expected = (0.0, None, "Sqrt", "backward")
    outputs = keras.layers.Dense(1, name="out", kernel_initializer="ones")(hidden)
    model = keras.Model(inputs, outputs)
    if expected[1] is None:  # the op node's name, as Keras gave it
        node = [op for op in model.operations if type(op).__name__ == expected[2]][0]
        expected = (expected[0], node.name) + expected[2:]
    return model, expected


def _compiled(model, jit=True, steps_per_execution=1, optimizer="sgd"):
    model.compile(keras.optimizers.get(optimizer), "mse", jit_compile=jit,
                  steps_per_execution=steps_per_execution)
    return model


def _plain_weights(build, x, y, batches, **compile_options):
    """The weights of a plain ``fit`` on the first ``batches`` batches (none: the initial weights)."""
    model = _compiled(build(), **compile_options)
    if batches:
        model.fit(x[: batches * BATCH], y[: batches * BATCH], batch_size=BATCH, shuffle=False, verbose=0)
    return [np.asarray(weight) for weight in model.get_weights()]


def _assert_same_weights(model, expected):
    actual = model.get_weights()
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert np.all(np.isfinite(got))
        np.testing.assert_array_equal(got, want)


def _assert_same_moments(optimizer_variables, expected):
    """Adam's state equal to plain fit's, each element within one ulp.

    Two XLA programs (Keras' step, and the guarded step with its update in a
    `lax.cond` branch) need not round alike. On the AMD EPYC CI machine of
    2026-12-07 one element of a BatchNormalization gamma's first moment came
    out one ulp away from plain fit's after 11 steps (the weights, the
    second moments and the loss history stayed bit for bit; bit for bit on
    the Intel Xeon machines before it). In Keras' step XLA fuses the last
    elementwise stage of gamma's gradient into the moment's update; in the
    guarded step the sentinel reads that gradient too, so XLA computes it in
    a fusion of its own: the same ops, compiled apart (docs/guard.md).
    """
    for got, want in zip(optimizer_variables, expected, strict=True):
        assert np.asarray(got).dtype == np.asarray(want).dtype, got.path
        try:
            np.testing.assert_array_max_ulp(np.asarray(got), np.asarray(want), maxulp=1)
        except AssertionError as error:  # which variable (assert_array_max_ulp takes no message)
            raise AssertionError(f"{got.path}: {error}") from None


BIRTHPLACES = ["lambda_sqrt_forward", "op_log_forward", "custom_divide_forward", "lambda_sqrt_backward",
               "op_sqrt_backward"]


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
@pytest.mark.parametrize("birthplace", BIRTHPLACES)
def test_the_guard_names_a_nan_born_in_a_weightless_place(birthplace, jit):
    bad_batch = 2
    keras.utils.set_random_seed(1)
    model, (bad_value, born_at, born_type, born_in) = _model(birthplace)
    initial = model.get_weights()

    def build():
        clone, _ = _model(birthplace)
        clone.set_weights(initial)
        return clone

    x, y = _positive_data(6, bad_batch, bad_value)
    expected = _plain_weights(build, x, y, bad_batch, jit=jit)
    guard = kgrad.NonFiniteGuard()
    _compiled(model, jit=jit).fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])

    report = guard.report
    assert (report.step, report.batch_index, report.last_finite_step) == (bad_batch, bad_batch, bad_batch - 1)
    assert (report.born_in, report.born_at, report.born_type) == (born_in, born_at, born_type)
    assert report.replayed is True
    assert report.born_path == born_at
    checkify_words = {"lambda_sqrt_forward": "nan generated by primitive: sqrt", "op_log_forward": None,
                      "custom_divide_forward": "division by zero", "lambda_sqrt_backward": "division by zero",
                      "op_sqrt_backward": "division by zero"}[birthplace]
    if checkify_words is None:  # checkify's float checks find NaN and division by zero, not log(0)'s -inf
        assert report.replay_note is None
    else:
        assert f"jax.experimental.checkify (float checks) says: {checkify_words}" in report.replay_note
    _assert_same_weights(model, expected)
    assert int(model.optimizer.iterations.numpy()) == bad_batch  # the bad step's update was not applied


def test_the_report_counts_are_numpys_and_the_message_is_tensorflows(capsys, tmp_path):
    bad_batch = 2
    keras.utils.set_random_seed(2)
    model, _ = _model("lambda_sqrt_forward")
    x, y = _positive_data(4, bad_batch, -1.0)
    x[bad_batch * BATCH + 2, 0] = -4.0  # a second bad row: 4 NaN from the roots in all
    guard = kgrad.NonFiniteGuard(log_dir=str(tmp_path / "logs"))
    _compiled(model).fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    bad_x = x[bad_batch * BATCH:(bad_batch + 1) * BATCH]
    with np.errstate(invalid="ignore"):
        roots = np.sqrt(bad_x)
    assert (report.born_nan_count, report.born_inf_count) == (int(np.isnan(roots).sum()), 0)
    assert report.born_input_range == (float(bad_x.min()), float(bad_x.max()))
    # The sentinel's own counts: the loss is NaN once; the first weight gradient checked after it.
    assert report.tensor == "loss/loss" and report.kind == "loss" and report.pass_ == "forward"
    assert (report.nan_count, report.inf_count) == (1, 0)
    assert set(report.non_finite) == {"loss/loss", "weight_grad/out/kernel", "weight_grad/out/bias"}
    # The loss's norm on the last finite step: the plain model's loss on that batch, by NumPy.
    keras.utils.set_random_seed(2)
    plain, _ = _model("lambda_sqrt_forward")
    before = _compiled(plain)
    before.fit(x[: (bad_batch - 1) * BATCH], y[: (bad_batch - 1) * BATCH], batch_size=BATCH, verbose=0)
    clean = slice((bad_batch - 1) * BATCH, bad_batch * BATCH)
    loss = np.mean((np.asarray(before.predict(x[clean], verbose=0), np.float64) - y[clean]) ** 2)
    np.testing.assert_allclose(report.last_finite_norm, loss, rtol=1e-5)
    printed = capsys.readouterr().err
    assert printed.startswith("kgrad.NonFiniteGuard stopped training: Non-finite values at step 2: first in "
                              "forward order is loss of 'loss' (loss/loss) with 1 NaN and 0 Inf.")
    assert "Replayed: the first NaN/Inf was born in the forward pass at 'root' (Lambda, path 'root')" \
        in printed
    assert "nan generated by primitive: sqrt" in printed and "test_guard_jax.py" in printed
    assert printed.rstrip().endswith("The weights are those of the last finite step.")
    # log_dir: the report, read back as the kgrad tab reads it.
    (written,) = guard_reports(events.read_run(events.find_runs(str(tmp_path / "logs"))["kgrad"]))
    assert (written["message"], written["step"], written["born_at"]) == (str(report), 2, "root")


def _mlp(seed, batch_norm=False):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((3,)), keras.layers.Dense(4, name="hidden")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization(name="norm"))
    layers += [keras.layers.Lambda(lambda t: keras.ops.sqrt(keras.ops.abs(t) + 1e-3), name="root"),
               keras.layers.Dense(1, name="out")]
    return keras.Sequential(layers)


def _nan_data(batches, bad_batch):
    """Finite data whose batch ``bad_batch`` holds a NaN input (born in the data)."""
    x, y = _positive_data(batches, None, 0.0)
    if bad_batch is not None:
        x[bad_batch * BATCH + 2, 1] = np.nan
    return x, y


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_steps_per_execution_3_keeps_the_tripped_batch_and_its_index(jit):
    bad_batch = 4  # the middle step of the second execution (batches 3, 4, 5)
    x, y = _nan_data(9, bad_batch)
    expected = _plain_weights(lambda: _mlp(3, batch_norm=True), x, y, bad_batch, jit=jit, optimizer="adam")
    model = _compiled(_mlp(3, batch_norm=True), jit=jit, steps_per_execution=3, optimizer="adam")
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    assert (report.step, report.batch_index, report.last_finite_step) == (bad_batch, bad_batch, bad_batch - 1)
    assert (report.born_in, report.born_at, report.born_nan_count) == ("data", "input", 1)
    # The step after the trip in the same execution was not applied either; BatchNormalization's
    # moving statistics and Adam's moments are those of before the bad step.
    _assert_same_weights(model, expected)
    _assert_same_moments(model.optimizer.variables, _adam_state(x, y, bad_batch, jit))


def _adam_state(x, y, batches, jit):
    model = _compiled(_mlp(3, batch_norm=True), jit=jit, optimizer="adam")
    model.fit(x[: batches * BATCH], y[: batches * BATCH], batch_size=BATCH, shuffle=False, verbose=0)
    return model.optimizer.variables


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_no_trip_trains_exactly_as_plain_fit(steps_per_execution):
    x, y = _nan_data(7, None)
    plain = _compiled(_mlp(4, batch_norm=True), steps_per_execution=steps_per_execution, optimizer="adam")
    plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = _compiled(_mlp(4, batch_norm=True), steps_per_execution=steps_per_execution, optimizer="adam")
    guard = kgrad.NonFiniteGuard()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[guard])
    assert guard.report is None and guard.reports == []
    _assert_same_weights(model, plain.get_weights())
    _assert_same_moments(model.optimizer.variables, plain.optimizer.variables)  # Adam's moments too
    assert history.history["loss"] == plain.history.history["loss"]
    # The model's train function is Keras' own again after fit.
    assert not hasattr(model.train_function, "run")


#: The plain fit's weights before each bad batch: both orders of callbacks compare with the same
#: fit (a deterministic function of the batch: the seed, the data), computed once.
_PLAIN_BEFORE_BAD_BATCH = {}


@pytest.mark.parametrize("order", ["probe_first", "guard_first"])
@pytest.mark.parametrize("bad_batch", [2, 3], ids=["probed_step", "unprobed_step"])
def test_the_guard_and_a_probe_together(tmp_path, bad_batch, order):
    x, y = _nan_data(6, bad_batch)
    if bad_batch not in _PLAIN_BEFORE_BAD_BATCH:
        _PLAIN_BEFORE_BAD_BATCH[bad_batch] = _plain_weights(lambda: _mlp(5), x, y, bad_batch)
    expected = _PLAIN_BEFORE_BAD_BATCH[bad_batch]
    model = _compiled(_mlp(5))
    guard = kgrad.NonFiniteGuard()
    probe = kgrad.GradientProbe(str(tmp_path / "logs"), every_n_steps=2)
    callbacks = [probe, guard] if order == "probe_first" else [guard, probe]
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=callbacks)
    report = guard.report
    assert (report.step, report.batch_index) == (bad_batch, bad_batch)
    assert (report.born_in, report.born_at) == ("data", "input")
    _assert_same_weights(model, expected)
    scalars = kgrad.read_logs(str(tmp_path / "logs"))["kgrad"]["scalars"]
    steps = scalars["weight_grad_norm/hidden/kernel"].steps
    # Probed steps 0 and 2 ran; the probed step that tripped is written too (it is what the step saw).
    assert steps.tolist() == [0, 2]


def test_warn_skips_each_bad_step_and_counts_batches_per_epoch():
    bad_batch = 1
    x, y = _nan_data(4, bad_batch)
    guard = kgrad.NonFiniteGuard(action="warn")
    model = _compiled(_mlp(6))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[guard])
    messages = [str(w.message) for w in caught if "kgrad.NonFiniteGuard" in str(w.message)]
    assert len(messages) == 2
    assert all(message.startswith("kgrad.NonFiniteGuard: Non-finite values") for message in messages)
    # A skipped step does not count: epoch 0 applied 3 of its 4 steps, so epoch 1's batch 1 is step 4.
    assert [(r.step, r.batch_index, r.born_at) for r in guard.reports] == [(1, 1, "input"), (4, 1, "input")]
    assert int(model.optimizer.iterations.numpy()) == 6
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())


def test_raise_raises_with_the_report_and_detaches():
    x, y = _nan_data(4, 2)
    model = _compiled(_mlp(7))
    with pytest.raises(kgrad.NonFiniteError) as raised:
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0,
                  callbacks=[kgrad.NonFiniteGuard(action="raise")])
    assert (raised.value.report.step, raised.value.report.born_in) == (2, "data")
    assert not hasattr(model.train_function, "run")  # Keras' own function is back


def test_replay_step_replays_a_dumped_step(tmp_path):
    model = _compiled(_model("custom_divide_forward")[0])
    x, y = _positive_data(3, 1, 0.0)
    guard = kgrad.NonFiniteGuard(dump_dir=str(tmp_path / "dump"))
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    assert (tmp_path / "dump" / "step_1.npz").exists()
    replayed = kgrad.replay_step(model, dict(np.load(tmp_path / "dump" / "step_1.npz")), step=1)
    assert (replayed.born_in, replayed.born_at, replayed.born_type, replayed.step) == (
        "forward", "normalize", "Normalize", 1)


def test_guard_update_keeps_the_state_of_before_and_records_the_trip():
    old = ({"w": jnp.ones(3)}, [jnp.asarray(5)])
    new = ({"w": jnp.array([2.0, 3.0, 4.0])}, [jnp.asarray(6)])
    record = initial_record(2)
    state, record = jax.jit(guard_update, static_argnames="halt_updates")(
        old, new, jnp.float32(3.0), [jnp.array([1.0, 2.0, 2.0])], record, step=5)
    assert state[0]["w"].tolist() == [2.0, 3.0, 4.0] and not bool(record.tripped)
    assert record.last_finite_squares.tolist() == [9.0, 9.0] and int(record.last_finite_step) == 5
    # A sum of squares that overflows float32 is not a trip: every element is finite.
    big = jnp.full((4,), 3e38, jnp.float32)
    state, record = guard_update(old, new, jnp.float32(1.0), [big], record, step=6)
    assert not bool(record.tripped) and int(record.last_finite_step) == 6 and state[1][0] == 6
    bad = jnp.array([np.nan, np.inf, -np.inf, 1.0])
    state, record = guard_update(old, new, jnp.float32(1.0), [bad], record, step=7)
    assert state[0]["w"].tolist() == [1.0, 1.0, 1.0] and int(state[1][0]) == 5
    assert bool(record.tripped) and record.counts.tolist() == [[0, 0], [1, 2]]
    assert (int(record.trip_step), int(record.trip_batch), int(record.batch)) == (7, 2, 3)
    # halt_updates: a finite step after the trip is not applied either.
    state, record = guard_update(old, new, jnp.float32(1.0), [jnp.ones(4)], record, step=8)
    assert int(state[1][0]) == 5 and int(record.last_finite_step) == 6


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_guard_apply_runs_the_update_only_on_a_clean_step_and_records_as_guard_update(jit):
    old = {"w": jnp.ones(3)}
    update = lambda scale: {"w": old["w"] * scale}  # noqa: E731
    apply = jax.jit(guard_apply, static_argnames=("update", "halt_updates")) if jit else guard_apply
    records = {}
    for name, step_of in (("apply", apply), ("update", guard_update)):
        record = initial_record(2)
        kept = []
        # Clean; squares beyond float32 with every element finite (clean); NaN/Inf (a trip); clean after it.
        for step, gradient in enumerate([jnp.ones(4), jnp.full((4,), 3e38, jnp.float32),
                                         jnp.array([np.nan, np.inf, -np.inf, 1.0]), jnp.ones(4)]):
            if name == "apply":
                state, record, applied = step_of(jnp.float32(1.0), [gradient], record, step, update,
                                                 jnp.float32(step + 2), old)
                assert bool(applied) == (step < 2)
            else:
                state, record = step_of(old, update(jnp.float32(step + 2)), jnp.float32(1.0), [gradient],
                                        record, step)
            kept.append(state["w"].tolist())
        assert kept == [[2.0] * 3, [3.0] * 3, [1.0] * 3, [1.0] * 3]
        records[name] = jax.tree.map(np.asarray, record)
    assert bool(records["apply"].tripped) and records["apply"].counts.tolist() == [[0, 0], [1, 2]]
    for got, want in zip(records["apply"], records["update"]):
        np.testing.assert_array_equal(got, want)


def test_keras_dispatches_the_guard_asynchronously_unless_it_warns():
    model = _compiled(_mlp(9))
    assert keras.callbacks.CallbackList([kgrad.NonFiniteGuard()], model=model)._async_train
    # "warn" replays each trip while training goes on: its batch ends run in order.
    assert not keras.callbacks.CallbackList([kgrad.NonFiniteGuard(action="warn")], model=model)._async_train


def test_batches_do_not_sync_the_model_state():
    # `Callback.model` copies the trainer's state into the variables on JAX (a device
    # read of every weight, and the end of asynchronous dispatch): not on every batch.
    def state_syncs(guarded, batches):
        model = _compiled(_mlp(10))
        syncs = []
        original = model.jax_state_sync

        def counted():
            syncs.append(1)
            return original()

        object.__setattr__(model, "jax_state_sync", counted)
        x, y = _nan_data(batches, None)
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                  callbacks=[kgrad.NonFiniteGuard()] if guarded else [])
        return len(syncs)

    assert state_syncs(True, 5) - state_syncs(False, 5) == state_syncs(True, 20) - state_syncs(False, 20)


def test_a_nan_born_in_a_nested_model_is_named_with_its_path():
    keras.utils.set_random_seed(11)
    root = keras.layers.Lambda(lambda t: keras.ops.sqrt(t), name="root")
    inner = keras.Sequential([keras.Input((4,)), root, keras.layers.Dense(2, name="d")], name="inner")
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, use_bias=False, kernel_initializer="ones", name="hidden")(inputs)
    model = _compiled(keras.Model(inputs, keras.layers.Dense(1, name="out")(inner(hidden))))
    x, y = _positive_data(4, 2, 0.0)  # sqrt at 0 inside the nested model: Inf in the backward pass
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    assert (report.step, report.born_in) == (2, "backward")
    assert (report.born_at, report.born_type, report.born_path) == ("root", "Lambda", "inner/root")
    assert (report.born_nan_count, report.born_inf_count) == (0, 4)  # dJ/d(input of root): 4 features at 0


def test_the_replay_draws_the_dropout_mask_of_the_tripped_step():
    keras.utils.set_random_seed(12)
    model = _compiled(keras.Sequential([
        keras.Input((8,)), keras.layers.Dropout(0.5, name="drop"),
        keras.layers.Lambda(lambda t: keras.ops.log(t), name="log"), keras.layers.Dense(1, name="out"),
    ]))
    x, y = np.ones((4 * BATCH, 8), "float32"), np.ones((4 * BATCH, 1), "float32")
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    assert (report.step, report.born_in, report.born_at) == (0, "forward", "log")
    # The guard kept the seed generator's state of before the step: the layer, called
    # eagerly from it, drops what the step and its replay dropped (log(0) = -inf).
    dropped = int(np.sum(np.asarray(model.get_layer("drop")(x[:BATCH], training=True)) == 0))
    assert 0 < dropped < BATCH * 8
    assert (report.born_nan_count, report.born_inf_count) == (0, dropped)


def test_a_probing_model_is_refused_with_the_reason(tmp_path):
    inputs = keras.Input((3,))
    model = _compiled(kgrad.ProbingModel(inputs, keras.layers.Dense(1)(inputs)))
    with pytest.raises(kgrad.backends.UnsupportedBackendError,
                       match=r"is a kgrad.ProbingModel.*pass kgrad.GradientProbe\(...\) to fit instead"):
        model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0,
                  callbacks=[kgrad.NonFiniteGuard(log_dir=str(tmp_path / "g"))])
    assert not (tmp_path / "g").exists()


def test_an_update_that_overflows_a_weight_is_blamed_on_the_weights_and_its_step():
    keras.utils.set_random_seed(14)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="out")])
    model.compile(keras.optimizers.SGD(1e37), "mse")  # finite gradients, an update past float32's max
    x, y = _positive_data(4, None, 0.0)
    y[:] = 1e3
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    assert (report.born_in, report.born_at, report.born_type) == ("weights", "out/kernel", "weight")
    assert report.born_step == report.last_finite_step == report.step - 1
    kernel = model.get_layer("out").kernel.numpy()
    assert report.born_inf_count == int(np.isinf(kernel).sum()) > 0


def test_a_loss_that_is_not_finite_with_finite_layers_is_blamed_on_the_loss():
    keras.utils.set_random_seed(15)
    out = keras.layers.Dense(1, name="out", kernel_initializer="ones")
    model = keras.Sequential([keras.Input((3,)), out])
    model.compile("sgd", lambda y_true, y_pred: keras.ops.mean(keras.ops.log(y_pred - y_true)))
    x, y = _positive_data(4, None, 0.0)
    y[:] = 0.0
    y[2 * BATCH + 1] = 100.0  # log of a negative difference in batch 2
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    assert (report.step, report.born_in, report.born_at, report.born_type) == (2, "forward", "loss", "loss")
    assert "the replay does not split the loss into its terms" in report.replay_note


def test_first_non_finite_names_the_guard_and_replay_step_on_jax():
    with pytest.raises(kgrad.backends.UnsupportedBackendError,
                       match=r"kgrad.first_non_finite .*kgrad.NonFiniteGuard\(\).*kgrad.replay_step"):
        kgrad.first_non_finite(None)


def test_under_a_loss_scale_optimizer_the_loss_is_checked_and_its_own_skips_are_not_trips():
    def build():
        keras.utils.set_random_seed(16)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="hidden"),
                                  keras.layers.Dense(1, name="out", dtype="float32")])
        model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), "mse")
        return model

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = _nan_data(4, 2)
        plain = build()
        plain.fit(x[: 2 * BATCH], y[: 2 * BATCH], batch_size=BATCH, shuffle=False, verbose=0)
        model = build()
        guard = kgrad.NonFiniteGuard()
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    report = guard.report
    # The scaled gradients that overflow on purpose are not checked: only the loss.
    assert list(report.non_finite) == ["loss/loss"]
    assert (report.batch_index, report.born_in, report.born_at) == (2, "data", "input")
    assert report.step == int(plain.optimizer.iterations.numpy())  # the loss scaler's own skips not counted
    _assert_same_weights(model, plain.get_weights())


def test_a_second_fit_reuses_the_guard_and_counts_afresh():
    model = _compiled(_mlp(17))
    guard = kgrad.NonFiniteGuard()
    clean_x, clean_y = _nan_data(3, None)
    model.fit(clean_x, clean_y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    assert guard.report is None
    run = attached.get(model, "kept_guard_runs")[-1]
    x, y = _nan_data(4, 1)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    assert (guard.report.step, guard.report.batch_index, guard.report.last_finite_step) == (4, 1, 3)
    assert attached.get(model, "kept_guard_runs")[-1] is run  # its compiled step, kept
