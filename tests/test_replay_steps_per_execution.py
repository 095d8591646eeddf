"""NonFiniteGuard with several steps per execution, and where a tripped step's batch is kept.

The tripped step's own batch and index within its epoch, with executions of
several steps (graph and XLA), and the unit checks of how the traced step
keeps or returns its batch. Apart from tests/test_replay.py (the faults named
at their layer or op) so that ``-n 2 --dist loadscope`` can run the two
halves, each about a minute of tracing and XLA compiles, in both workers.
"""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from kgrad.backends.common.batch_dump import BATCH_OUTPUT
from kgrad.backends.tensorflow.guard import sentinel as guard_state, tripped_batch
from kgrad.backends.tensorflow.guard.watched import TRIPPED_OUTPUT
from test_replay import BAD_ROW, BATCH, _born, _data, _fit, _sequential

@pytest.mark.parametrize("jit_compile", [False, True])
def test_steps_per_execution_keeps_the_tripped_batch(jit_compile):
    x, y = _data()
    x[BAD_ROW, 0] = 0.0  # step 2: the middle of the first execution of 4 steps
    model = _sequential(keras.layers.Lambda(keras.ops.log, name="middle"))
    report = _fit(model, x, y, jit_compile, steps_per_execution=4)
    # Keras tells callbacks the execution's last batch (3): the index is counted on the device.
    assert (report.step, report.kind, report.batch_index) == (2, "loss", 2)
    # The tripped step's own batch, not the execution's last one; under XLA
    # the step compiles its own body and the batch is kept outside it.
    assert _born(report) == (2, "forward", "middle", "Lambda") and report.replayed
    assert report.born_inf_count == 1
    assert model.optimizer.iterations.numpy() == 2  # steps 2 and 3 applied nothing


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("with_probe", [False, True])
def test_with_steps_per_execution_each_trip_has_its_batch_index_within_its_epoch(
    jit_compile, with_probe, tmp_path
):
    x, y = _data()  # 8 batches an epoch: executions of batches 0-2, 3-5 and 6-7
    x[4 * BATCH + 1, 0] = 0.0  # batch 4: the middle of the second execution
    x[7 * BATCH + 2, 1] = 0.0  # batch 7: the last of the short third one
    model = _sequential(keras.layers.Lambda(keras.ops.log, name="middle"))
    guard = kgrad.NonFiniteGuard(action="warn")
    # A probe makes executions alternate between two traced functions, which
    # must share the count.
    callbacks = [kgrad.GradientProbe(str(tmp_path), every_n_steps=6)] if with_probe else []
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=jit_compile, steps_per_execution=3)
    with pytest.warns(RuntimeWarning, match="Non-finite values at step"):
        model.fit(x, y, batch_size=BATCH, shuffle=False, epochs=2, callbacks=[*callbacks, guard], verbose=0)
    # The count restarts at each epoch's begin. With "warn" only the bad
    # steps' updates are skipped: epoch 1 applies 6 of its 8, epoch 2 too.
    assert [r.batch_index for r in guard.reports] == [4, 7, 4, 7]
    assert [r.step for r in guard.reports] == [4, 6, 10, 12]
    assert all(_born(r)[1:] == ("forward", "middle", "Lambda") and r.replayed for r in guard.reports)
    assert "Batch 7 of the epoch." in str(guard.reports[1])


class _Traced:
    """The parts of a traced guarded step that `keeping_the_batch` reads and writes."""

    def __init__(self, steps_per_execution=1):
        self.plan = types.SimpleNamespace(
            guard=kgrad.NonFiniteGuard().config, steps_per_execution=steps_per_execution,
            compiles_step_inside=False, replicas=1,
        )
        self.tripped_batch = self.batch_not_kept = None


@pytest.mark.parametrize(
    "data, jit_compile, returned",
    [
        ((np.ones((4, 3), "float32"), np.ones((4, 1), "float32")), False, False),
        ((np.ones((4, 3), "float32"), np.ones((4, 1), "float32")), True, True),
        ((np.array([["a"], ["b"]]), np.ones((2, 1), "float32")), False, True),
        ((tf.ragged.constant([[1.0], [2.0, 3.0]]), np.ones((2, 1), "float32")), False, True),
    ],
    ids=["numbers", "xla", "strings", "ragged"],
)
def test_the_batch_is_returned_only_where_variables_cannot_keep_it(data, jit_compile, returned):
    # Each output of Keras' train function costs host time every step: a
    # clean step returns its batch only where a variable cannot take it.
    model = _sequential()
    model.compile("sgd", "mse", jit_compile=jit_compile)
    traced = _Traced()
    tripped = tf.Variable(False)

    @tf.function
    def step(data):
        outputs = {"loss": tf.constant(0.0), TRIPPED_OUTPUT: tripped.read_value()}
        return tripped_batch.keeping_the_batch(model, traced, outputs, data)

    outputs = step(data)
    assert (BATCH_OUTPUT in outputs) == returned
    assert (traced.tripped_batch is None) == returned
    if not returned:
        assert traced.tripped_batch.read() is None  # clean: nothing written
        tripped.assign(True)
        step(data)
        kept, _, index = traced.tripped_batch.read()
        assert index is None  # one step per execution: Keras gives it
        for got, want in zip(tf.nest.flatten(kept), tf.nest.flatten(data)):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "data, jit_compile, keeps",
    [
        ((np.ones((2, 1), "float32"), np.zeros((2, 1), "float32")), False, True),
        ((np.ones((2, 1), "float32"), np.zeros((2, 1), "float32")), True, False),
        ((np.array([["a"], ["b"]]), np.ones((2, 1), "float32")), False, False),
    ],
    ids=["numbers", "xla", "strings"],
)
def test_keras_own_step_keeps_its_batch_in_the_branch_of_a_trip_only(data, jit_compile, keeps):
    # Outside XLA the guard's branch of a trip writes the batch: a clean
    # step runs no op for it (no branch of its own, no output).
    model = _sequential()
    model.compile("sgd", "mse", jit_compile=jit_compile)
    traced = _Traced()
    state = guard_state.GuardState(["loss/loss"])
    applied = tf.Variable(0)

    @tf.function
    def step(data, loss):
        keep = tripped_batch.batch_keeper(model, traced, data)
        assert (keep is not None) == keeps
        state.guarded_apply([loss], tf.constant(0), lambda: applied.assign_add(1), True, on_trip=keep)

    step(data, tf.constant(1.0))
    assert int(applied.numpy()) == 1
    if not keeps:
        assert traced.tripped_batch is None
        assert traced.batch_not_kept is None  # the step returns it (`keeping_the_batch`)
        return
    assert traced.tripped_batch.read() is None  # clean: nothing written
    step(data, tf.constant(np.inf))
    assert int(applied.numpy()) == 1 and bool(state.tripped.numpy())
    kept, _, index = traced.tripped_batch.read()
    assert index is None  # one step per execution: Keras gives it
    for got, want in zip(tf.nest.flatten(kept), tf.nest.flatten(data)):
        np.testing.assert_array_equal(got, want)


def test_with_steps_per_execution_a_ragged_batch_is_not_kept_and_says_why():
    model = _sequential()
    model.compile("sgd", "mse")
    traced = _Traced(steps_per_execution=2)

    @tf.function
    def step(data):
        outputs = {"loss": tf.constant(0.0), TRIPPED_OUTPUT: tf.constant(True)}
        return tripped_batch.keeping_the_batch(model, traced, outputs, data)

    outputs = step((tf.ragged.constant([[1.0], [2.0, 3.0]]), np.ones((2, 1), "float32")))
    assert BATCH_OUTPUT not in outputs and traced.tripped_batch is None
    assert "ragged" in traced.batch_not_kept


@pytest.mark.parametrize("with_probe", [False, True])
def test_guard_under_xla_with_steps_per_execution_trains_like_plain_fit(with_probe):
    x, y = _data()
    models = []
    for _ in range(2):
        keras.utils.set_random_seed(0)  # the extra layer is made before _sequential seeds
        models.append(_sequential(keras.layers.Dense(4, name="extra")))
    guarded, plain = models
    guard = kgrad.NonFiniteGuard()
    callbacks = [kgrad.GradientProbe(every_n_steps=2)] if with_probe else []
    for model, extra in ((guarded, [guard, *callbacks]), (plain, [])):
        model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=True, steps_per_execution=3)
        model.fit(x, y, batch_size=BATCH, shuffle=False, epochs=2, verbose=0, callbacks=extra)
    assert guard.reports == []
    assert guarded.optimizer.iterations.numpy() == plain.optimizer.iterations.numpy() > 0
    for got, want in zip(guarded.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)

