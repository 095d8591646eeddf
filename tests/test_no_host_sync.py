"""GradientProbe reads device memory only after executions that contain a probed step.

In the spirit of Keras' own test that makes ``.numpy()`` raise: every eager
read of a kgrad variable raises, except inside the two documented reading points
(`ProbeState.read_since` and `ProbingStep.steps_run`), and each call of those
is logged after the callback event that caused it. The schedule of reads is
then compared with the probed steps, computed on the host.
"""

import keras
import pytest
import tensorflow as tf
from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

import kgrad
from fit_helpers import RecordCollector, classification_data, compile_classifier, sequential_classifier
from kgrad.backends.tensorflow.handover.state import ProbeState
from kgrad.backends.tensorflow.differentiate.step import ProbingStep

EVERY_N_STEPS = 5
STEPS_PER_EPOCH = 7  # not a multiple of 5: the probed batches move every epoch
EPOCHS = 3


class _EventLog(keras.callbacks.Callback):
    """Placed before the probe, logs each event before the probe handles it."""

    def __init__(self, log):
        super().__init__()
        self.log = log
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.log.append(("batch_end", self.epoch, batch))

    def on_epoch_end(self, epoch, logs=None):
        self.log.append(("epoch_end", epoch))

    def on_train_end(self, logs=None):
        self.log.append(("train_end",))


@pytest.fixture
def device_reads(monkeypatch):
    """The event log; any eager read of a kgrad variable elsewhere raises."""
    log = []
    reading = []
    original_read = BaseResourceVariable._read_variable_op

    def guarded_read(variable, *args, **kwargs):
        # Every read goes through here: numpy(), value(), int(variable)...
        # Reads traced into the step are graph ops, not host reads.
        if tf.executing_eagerly() and "kgrad" in variable.name and not reading:
            raise AssertionError(f"Host read of {variable.name} outside a reading point.")
        return original_read(variable, *args, **kwargs)

    monkeypatch.setattr(BaseResourceVariable, "_read_variable_op", guarded_read)
    for owner, name in ((ProbeState, "read_since"), (ProbingStep, "steps_run")):
        monkeypatch.setattr(owner, name, _logged(getattr(owner, name), name, log, reading))
    return log


def _logged(method, name, log, reading):
    def read(self, *args, **kwargs):
        log.append(("read", name))
        reading.append(name)
        try:
            return method(self, *args, **kwargs)
        finally:
            reading.pop()

    return read


def _read_points(log):
    """The event after which each ``read_since`` happened."""
    points, last_event = [], None
    for entry in log:
        if entry == ("read", "read_since"):
            points.append(last_event)
        elif entry[0] != "read":
            last_event = entry
    return points


def _fit(steps_per_execution, log, jit_compile=False, instruments=()):
    x, y = classification_data(samples=STEPS_PER_EPOCH * 2)
    model = compile_classifier(
        sequential_classifier(), jit_compile=jit_compile, steps_per_execution=steps_per_execution
    )
    collector = RecordCollector()
    probe = kgrad.GradientProbe(
        None, layers=["hidden"], every_n_steps=EVERY_N_STEPS, histograms=False, on_probe=collector,
        instruments=instruments,
    )
    model.fit(
        x, y, batch_size=2, epochs=EPOCHS, verbose=0, callbacks=[_EventLog(log), probe]
    )
    return model, collector


def _expected_read_points(steps_per_execution):
    points = []
    for epoch in range(EPOCHS):
        for first in range(0, STEPS_PER_EPOCH, steps_per_execution):
            last = min(first + steps_per_execution, STEPS_PER_EPOCH) - 1
            global_steps = range(epoch * STEPS_PER_EPOCH + first, epoch * STEPS_PER_EPOCH + last + 1)
            if any(step % EVERY_N_STEPS == 0 for step in global_steps):
                # Keras names an execution by its last batch as if it were full.
                points.append(("batch_end", epoch, first + steps_per_execution - 1))
        points.append(("epoch_end", epoch))
    return points + [("train_end",)]


def test_the_guard_catches_a_read(device_reads):
    state = ProbeState(1, ["a"], [], 2)
    for read in (lambda: state.written.numpy(), lambda: int(state.written), state.scalars.value):
        with pytest.raises(AssertionError, match="outside a reading point"):
            read()


@pytest.mark.parametrize(
    "steps_per_execution, jit_compile, instruments",
    [(1, False, ()), (3, False, ()), (1, True, ()), (3, False, ("optimizer", "logits"))],
    ids=["spe1", "spe3", "spe1-xla", "spe3-stability"],  # XLA: statistics run after the step
)
def test_reads_only_after_executions_with_a_probed_step(
    device_reads, steps_per_execution, jit_compile, instruments
):
    model, collector = _fit(steps_per_execution, device_reads, jit_compile, instruments)
    assert _read_points(device_reads) == _expected_read_points(steps_per_execution)
    total_steps = EPOCHS * STEPS_PER_EPOCH
    assert collector.steps == list(range(0, total_steps, EVERY_N_STEPS))
    if instruments:  # computed in the probed steps, read with their records only
        tags = {"adam_rms/hidden/kernel", "logit_max_max/output"}
        assert all(tags <= set(record.scalars) for record in collector.records)
    # Epochs of known length: the host counts steps exactly and never reads
    # the device counter.
    assert device_reads.count(("read", "steps_run")) == 0
