"""Executions without a probed step run Keras' own compiled train function."""

import keras
import numpy as np
import pytest

import kgrad
from kgrad.backends.common import attached


class _FunctionLog(keras.callbacks.Callback):
    """Placed after the probe: which function each execution is about to run."""

    def __init__(self):
        super().__init__()
        self.plain_function = None
        self.ran_plain = []

    def on_train_begin(self, logs=None):
        self.plain_function = attached.get(self.model, "installation").train_function

    def on_train_batch_begin(self, batch, logs=None):
        self.ran_plain.append(self.model.train_function is self.plain_function)


def _model(steps_per_execution):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="out")])
    model.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    return model


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_only_executions_with_a_probed_step_run_the_probing_function(steps_per_execution):
    x, y = np.ones((24, 3), "float32"), np.ones((24, 2), "float32")
    model = _model(steps_per_execution)
    model.make_train_function()
    original = model.train_function
    records, log = [], _FunctionLog()
    probe = kgrad.GradientProbe(every_n_steps=5, on_probe=records.append)
    model.fit(x, y, batch_size=2, epochs=2, shuffle=False, callbacks=[probe, log], verbose=0)
    executions = range(0, 24, steps_per_execution)  # 12 steps per epoch, 2 epochs
    probed = [any(s % 5 == 0 for s in range(first, first + steps_per_execution)) for first in executions]
    assert log.ran_plain == [not p for p in probed]
    assert log.plain_function is original
    assert [record.step for record in records] == [0, 5, 10, 15, 20]
    assert model.train_function is original
    # One step per execution: the probing function runs probed steps only,
    # and is traced without the probed/plain branch.
    assert probe._step.plan.probed_steps_only == (steps_per_execution == 1)


def test_with_a_guard_unprobed_executions_run_the_guard_alone():
    x, y = np.ones((16, 3), "float32"), np.ones((16, 2), "float32")
    model = _model(1)
    functions = []

    class Log(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            functions.append(self.model.train_function)

    records = []
    guard = kgrad.NonFiniteGuard()
    model.fit(
        x, y, batch_size=2, verbose=0,
        callbacks=[kgrad.GradientProbe(every_n_steps=5, on_probe=records.append), guard, Log()],
    )
    probing, guard_only = functions[0], functions[1]
    assert probing is not guard_only
    assert [f is probing for f in functions] == [s % 5 == 0 for s in range(8)]
    assert [f is guard_only for f in functions] == [s % 5 != 0 for s in range(8)]
    assert [record.step for record in records] == [0, 5]
    step = attached.get(model, "kept_step")[0]
    # One traced function per plan: the probe's runs probed steps only, the
    # guard's has no probe; both check the same tensors with one state.
    plans = [traced.plan for traced in step._traced]
    assert sorted((plan.probe is not None, plan.probed_steps_only) for plan in plans) == [
        (False, False), (True, True)
    ]
    assert guard.report is None
