"""`NonFiniteGuard(skip_spikes=True)` reads the device only after a skip and at an epoch's end.

As tests/test_no_host_sync.py does for the probe: every eager read of a kgrad variable raises
outside the spike state's reading point (`SpikeState.read`), and each of its calls is logged
after the callback event that caused it. TensorFlow only: the variables are TensorFlow's (the
JAX guard's record is tested in tests/jax/test_spike_skipping_reads_jax.py).
"""

import pytest
import tensorflow as tf
from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

from test_no_host_sync import _EventLog
from test_spike_skipping import fit_with_a_fault
from kgrad.backends.tensorflow.guard.sentinel import GuardState
from kgrad.backends.tensorflow.guard.spikes import SpikeState

STEPS_PER_EPOCH, EPOCHS = 30, 2


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
    return fit_with_a_fault([_EventLog(log)], STEPS_PER_EPOCH, EPOCHS, fault_step)


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
