"""Unit tests of the device-side ring buffer that hands probed steps to the host."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from kgrad.backends.tensorflow.handover.state import ProbeState
from kgrad.logs.record import ProbeRecord

BUCKETS = 2


def _state(capacity=2, scalar_names=("a", "b"), histogram_names=("h",)):
    return ProbeState(capacity, scalar_names, histogram_names, BUCKETS)


def _write(state, step, value):
    scalars = tf.constant([value] * len(state.scalar_names), tf.float32)
    histograms = tf.fill([len(state.histogram_names), BUCKETS, 3], float(value))
    state.write(tf.cast(step, tf.int64), scalars, histograms)


def test_read_returns_each_record_once_in_order():
    state = _state()
    _write(state, 7, 1.0)
    _write(state, 9, 2.0)
    records, written = state.read_since(0)
    assert written == 2
    assert [r.step for r in records] == [7, 9]
    assert records[1].scalars == {"a": 2.0, "b": 2.0}
    np.testing.assert_array_equal(records[1].histograms["h"], np.full((BUCKETS, 3), 2.0))
    assert state.read_since(written) == ([], 2)


def test_read_after_partial_delivery_returns_only_new_records():
    state = _state(capacity=3)
    for step in range(3):
        _write(state, step, float(step))
    _, delivered = state.read_since(0)
    _write(state, 3, 3.0)
    records, written = state.read_since(delivered)
    assert [r.step for r in records] == [3]
    assert written == 4


def test_ring_keeps_the_newest_capacity_records():
    state = _state(capacity=2)
    for step in range(5):
        _write(state, step, float(step))
    records, written = state.read_since(0)
    assert written == 5
    assert [r.step for r in records] == [3, 4]


def test_nothing_new_reads_only_the_write_counter(monkeypatch):
    state = _state()
    _write(state, 0, 1.0)
    _, delivered = state.read_since(0)
    read = []
    for name in ("steps", "scalars", "histograms"):
        variable = getattr(state, name)
        monkeypatch.setattr(state, name, _Spy(variable, read, name))
    assert state.read_since(delivered) == ([], 1)
    assert read == []


class _Spy:
    def __init__(self, variable, log, name):
        self._variable, self._log, self._name = variable, log, name

    def numpy(self):
        self._log.append(self._name)
        return self._variable.numpy()


@pytest.mark.parametrize("jit_compile", [False, True])
def test_write_compiles_in_a_tf_function(jit_compile):
    state = _state(capacity=1)

    @tf.function(jit_compile=jit_compile)
    def write(step):
        _write(state, step, 4.0)

    write(tf.constant(11, tf.int64))
    (record,), _ = state.read_since(0)
    assert record.step == 11
    assert record.scalars == {"a": 4.0, "b": 4.0}


@pytest.mark.parametrize(
    "scalar_names, histogram_names",
    [(("a",), ()), ((), ("h",)), ((), ())],
    ids=["no-histograms", "no-scalars", "nothing"],
)
def test_empty_parts_are_written_and_read(scalar_names, histogram_names):
    # histograms=False gives a state with no histogram; its scatter used to fail.
    state = _state(capacity=1, scalar_names=scalar_names, histogram_names=histogram_names)

    @tf.function
    def write():
        _write(state, 5, 1.0)

    write()
    (record,), _ = state.read_since(0)
    assert record.step == 5
    assert set(record.scalars) == set(scalar_names)
    assert set(record.histograms) == set(histogram_names)


def test_probe_record_is_immutable_plain_data():
    record = ProbeRecord(step=3, scalars={"a": 1.0}, histograms={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.step = 4


def test_probe_record_repr_is_short():
    # A 9-layer MLP's record: 305 scalars and 38 histograms of 30 buckets.
    scalars = {f"grad_norm/hidden_{index}": 0.001 * index for index in range(305)}
    histograms = {f"grad_hist/hidden_{index}": np.ones((30, 3)) for index in range(38)}
    text = repr(ProbeRecord(step=10, scalars=scalars, histograms=histograms, tape="generator"))
    assert text == (
        "ProbeRecord(step=10, tape='generator', 305 scalars, 38 histograms: "
        "grad_norm/hidden_0=0, grad_norm/hidden_1=0.001, grad_norm/hidden_2=0.002, ...)"
    )
    assert repr(ProbeRecord(0, {}, {})) == "ProbeRecord(step=0, 0 scalars, 0 histograms)"
    assert "'text'" in repr(ProbeRecord(1, {"a/b": "text"}, {}))
