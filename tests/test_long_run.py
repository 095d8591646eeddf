"""Long runs: 20 000 probed steps, and a run killed with SIGKILL mid-epoch."""

import gc
import os
import selectors
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

import kgrad
from kgrad.backends.tensorflow.differentiate.step import ProbingStep

KILLED_FIT = os.path.join(os.path.dirname(__file__), "scripts", "killed_fit.py")

STEPS_PER_EPOCH = 2000
EPOCHS = 10
#: Host memory the run may gain between the end of epoch 2 and the end: 8 MiB
#: over 16 000 steps, about 0.5 KiB a step. Keras alone gains about 0.15 KiB a
#: step here; keeping one record a step (its dicts of floats and arrays,
#: ~3 KiB) or one cached tensor a step (TensorFlow keeps the tensor of each
#: distinct Python int it converts, ~1.4 KiB) goes far beyond it.
RSS_GROWTH_LIMIT = 8 * 2**20


def _rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Monitor(keras.callbacks.Callback):
    """Traces and resident memory at the end of each epoch."""

    def __init__(self, traces):
        super().__init__()
        self._traces = traces
        self.traces_after_epoch = []
        self.rss_after_epoch = []

    def on_epoch_end(self, epoch, logs=None):
        gc.collect()
        self.traces_after_epoch.append(self._traces[0])
        self.rss_after_epoch.append(_rss_bytes())


@pytest.mark.slow
def test_twenty_thousand_probed_steps(tmp_path, monkeypatch):
    # The probing train_step runs in Python only when Keras traces it.
    traces = [0]
    train_step = ProbingStep.train_step

    def counting_train_step(self, data):
        traces[0] += 1
        return train_step(self, data)

    monkeypatch.setattr(ProbingStep, "train_step", counting_train_step)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(4, activation="tanh", name="hidden"),
            keras.layers.Dense(1, name="out"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=False)
    x = np.random.default_rng(0).normal(size=(STEPS_PER_EPOCH, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    probe = kgrad.GradientProbe(
        tmp_path,
        layers=["hidden"],
        every_n_steps=1,
        capture=["activation_gradients", "weight_gradients"],
        bucket_count=5,
    )
    monitor = _Monitor(traces)
    started = time.monotonic()
    model.fit(x, y, batch_size=1, epochs=EPOCHS, verbose=0, callbacks=[probe, monitor])
    print(f"fit: {time.monotonic() - started:.0f} s")

    total = STEPS_PER_EPOCH * EPOCHS
    assert int(model.optimizer.iterations.numpy()) == total
    # Traced in the first epoch only (Keras may trace twice when variables are
    # created), never again.
    assert monitor.traces_after_epoch[0] >= 1
    assert monitor.traces_after_epoch == [monitor.traces_after_epoch[0]] * EPOCHS
    growth = monitor.rss_after_epoch[-1] - monitor.rss_after_epoch[1]
    print(f"RSS after each epoch (MiB): {[round(r / 2**20, 1) for r in monitor.rss_after_epoch]}")
    assert growth < RSS_GROWTH_LIMIT, f"host memory grew by {growth / 2**20:.1f} MiB"

    started = time.monotonic()
    logs = kgrad.read_logs(tmp_path)["kgrad"]
    print(f"read_logs: {time.monotonic() - started:.0f} s")
    every_step = list(range(total))
    for tag in ("global/grad_norm", "grad_norm/hidden", "update_ratio/hidden/kernel"):
        assert logs["scalars"][tag].steps.tolist() == every_step, tag
    histogram = logs["histograms"]["weight_grad_hist/hidden/kernel"]
    assert histogram.steps.tolist() == every_step
    assert np.all(histogram.values[:, :, 2].sum(axis=1) == 16)


def _read_lines_until(process, done, timeout):
    """Reads ``process``'s stdout lines until ``done(lines)``; returns them."""
    lines = []
    deadline = time.monotonic() + timeout
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    while not done(lines):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not selector.select(timeout=remaining):
            raise AssertionError(f"no progress in {timeout} s; output so far: {lines}")
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"the run ended on its own; output: {lines}")
        lines.append(line.strip())
    return lines


def _killed_after_a_flush(lines):
    """A flush happened, then training went on to the middle of the next epoch."""
    flushes = [index for index, line in enumerate(lines) if line.startswith("flushed")]
    return bool(flushes) and any(line == "mid-epoch" for line in lines[flushes[-1] :])


@pytest.mark.slow
def test_run_killed_mid_epoch_leaves_readable_events_up_to_the_last_flush(tmp_path):
    process = subprocess.Popen(
        [sys.executable, KILLED_FIT, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    try:
        # Two flushes, so that the kill comes after events were both flushed
        # and written again.
        lines = _read_lines_until(
            process,
            lambda lines: sum(line.startswith("flushed") for line in lines) >= 2
            and _killed_after_a_flush(lines),
            timeout=240,
        )
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    flushed = max(int(line.split()[1]) for line in lines if line.startswith("flushed"))

    # kgrad.read_logs: every step up to the last flush, in order, once each;
    # steps written after it may be there too, never a gap.
    logs = kgrad.read_logs(tmp_path)["kgrad"]
    steps = logs["scalars"]["global/grad_norm"].steps.tolist()
    assert len(steps) >= flushed
    assert steps == list(range(len(steps)))
    assert np.all(np.isfinite(logs["scalars"]["global/grad_norm"].values))
    assert logs["histograms"]["weight_grad_hist/hidden/kernel"].steps.tolist()[:flushed] == list(
        range(flushed)
    )

    # TensorBoard's own reader agrees.
    accumulator = event_accumulator.EventAccumulator(
        str(tmp_path / "kgrad"), size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    events = accumulator.Tensors("global/grad_norm")
    assert [event.step for event in events][:flushed] == list(range(flushed))
