"""Sinks after a fit that raised: Keras calls no ``on_train_end``, yet nothing queued is lost."""

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import kgrad
from kgrad import backends
from kgrad.sinks import worker


class _Recording(kgrad.Sink):
    def __init__(self):
        super().__init__()
        self.calls = []

    def open(self):
        self.calls.append("open")

    def write_record(self, record):
        self.calls.append(("record", record.step))

    def close(self):
        self.calls.append("close")


class _RaiseAtBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            raise RuntimeError("the user's callback failed")


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    model.compile("sgd", "mse")
    return model


def _fit(model, callbacks):
    x = np.ones((8, 2), "float32")
    model.fit(x, np.ones((8, 1)), batch_size=2, verbose=0, callbacks=callbacks)


def test_a_fit_that_raised_has_its_sinks_closed_when_the_callback_fits_again():
    sink = _Recording()
    probe = kgrad.GradientProbe(every_n_steps=1, sinks=[sink])
    model = _model()
    with pytest.raises(RuntimeError, match="the user's callback failed"):
        _fit(model, [probe, _RaiseAtBatch()])
    assert "close" not in sink.calls  # no on_train_end: the sink is still open

    _fit(model, [probe])
    first_close = sink.calls.index("close")
    # The first fit's records were delivered and the sink closed before the second fit opened it.
    assert sink.calls[0] == "open" and sink.calls[first_close + 1] == "open"
    assert ("record", 0) in sink.calls[:first_close]
    assert sink.calls[-1] == "close" and sink.calls.count("close") == 2
    assert worker.users(sink) == 0 and not [name for name in vars(sink) if "kgrad" in name]


def test_a_callback_whose_installation_fails_closes_the_sinks_it_opened(monkeypatch):
    backend = backends.current()

    def failing_attach(*args, **kwargs):
        raise RuntimeError("installation failed")

    monkeypatch.setattr(backend, "attach", failing_attach)
    for callback_type in (kgrad.GradientProbe, kgrad.NonFiniteGuard):
        sink = _Recording()
        with pytest.raises(RuntimeError, match="installation failed"):
            _fit(_model(), [callback_type(sinks=[sink])])
        assert sink.calls == ["open", "close"], callback_type.__name__
        assert worker.users(sink) == 0


def test_a_script_that_dies_of_an_error_still_delivers_what_it_queued(tmp_path):
    # The worker's thread is a daemon: without the exit hook, the interpreter would stop it
    # with its queue unsent (a tracker's run unfinished, a file without its last lines).
    out = tmp_path / "delivered.txt"
    script = textwrap.dedent(f"""
        import time
        import kgrad
        from kgrad.sinks import worker

        class Slow(kgrad.Sink):
            def open(self):
                self.file = open({str(out)!r}, "w")
            def write_record(self, record):
                time.sleep(0.05)
                self.file.write(record + "\\n")
            def close(self):
                self.file.write("closed\\n")
                self.file.close()

        sink_worker = worker.acquire(Slow())
        for index in range(5):
            sink_worker.offer("write_record", str(index))
        raise RuntimeError("the fit failed")
    """)
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 1 and "the fit failed" in finished.stderr
    assert out.read_text().split() == ["0", "1", "2", "3", "4", "closed"]
