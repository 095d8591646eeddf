"""`NonFiniteGuard(skip_spikes=True)` reads the device only after a skip and at an epoch's end.

As tests/test_no_host_sync.py does for the probe: every eager read of a kgrad variable raises
outside the spike state's reading point (`SpikeState.read`), and each of its calls is logged
after the callback event that caused it. TensorFlow only: the variables are TensorFlow's (the
JAX guard's record is tested in tests/jax/test_spike_skipping_reads_jax.py).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

import kgrad
from kgrad.backends.tensorflow.guard.sentinel import GuardState
from kgrad.backends.tensorflow.guard.spikes import SpikeState

STEPS_PER_EPOCH, EPOCHS, BATCH = 30, 2, 8


class _EventLog(keras.callbacks.Callback):
    def __init__(self, log):
        super().__init__()
        self.log, self.epoch = log, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.log.append(("batch_end", self.epoch, batch))

    def on_epoch_end(self, epoch, logs=None):
        self.log.append(("epoch_end", epoch))


@pytest.fixture
def device_reads(monkeypatch):
    log, reading = [], []
    original_read = BaseResourceVariable._read_variable_op

    def guarded_read(variable, *args, **kwargs):
        if tf.executing_eagerly() and "kgrad" in variable.name and not reading:
            raise AssertionError(f"Host read of {variable.name} outside a reading point.")
        return original_read(variable, *args, **kwargs)

    def logged(original, entry):
        def read(self, *args, **kwargs):
            log.append(entry)
            reading.append(True)
            try:
                return original(self, *args, **kwargs)
            finally:
                reading.pop()

        return read

    monkeypatch.setattr(BaseResourceVariable, "_read_variable_op", guarded_read)
    monkeypatch.setattr(SpikeState, "read", logged(SpikeState.read, ("read",)))
    # After a skip the flag may also be a NaN trip: the guard then reads its NaN report too.
    monkeypatch.setattr(GuardState, "read_report", logged(GuardState.read_report, ("report",)))
    return log


def _read_points(log, kind=("read",)):
    points, last = [], None
    for entry in log:
        if entry == kind:
            points.append(last)
        elif entry[0] not in ("read", "report"):
            last = entry
    return points


def _fit(log, fault_step=None):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(STEPS_PER_EPOCH * BATCH, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    if fault_step is not None:
        x[fault_step * BATCH : (fault_step + 1) * BATCH] *= 1000.0
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(1e-2), "mse")
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=8)
    model.fit(
        x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[_EventLog(log), guard]
    )
    return guard


def test_a_clean_run_reads_the_spike_state_at_each_epochs_end_only(device_reads):
    guard = _fit(device_reads)
    assert guard.skipped_steps == []
    assert _read_points(device_reads) == [("epoch_end", epoch) for epoch in range(EPOCHS)]
    assert _read_points(device_reads, ("report",)) == []
    assert len(guard._spikes.logs[None].rows) == EPOCHS * STEPS_PER_EPOCH  # every step's row, read late


def test_a_skipped_step_is_read_after_its_own_batch(device_reads):
    guard = _fit(device_reads, fault_step=20)
    # The faulty batch comes back in the second epoch: skipped again.
    assert [s.step for s in guard.skipped_steps] == [20, STEPS_PER_EPOCH + 20]
    assert _read_points(device_reads) == [
        ("batch_end", 0, 20),
        ("epoch_end", 0),
        ("batch_end", 1, 20),
        ("epoch_end", 1),
    ]
    assert _read_points(device_reads, ("report",)) == [("batch_end", 0, 20), ("batch_end", 1, 20)]
