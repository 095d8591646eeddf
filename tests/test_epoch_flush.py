"""Records reach the disk at each epoch's end, also small ones (``histograms=False``) that sit in a buffer.

An event file flushes every 10 events by itself; an epoch of 3 probed steps
without histograms writes fewer, so only the probe's flush at the epoch's end
puts them on disk. A callback after the probe reads the event files (and the
JSON Lines sink's file, which its worker flushes) at each epoch's end: without
those flushes it finds nothing. tests/jax runs the same test on JAX.
"""

import json
import os
import time

import keras
import numpy as np

import kgrad

STEPS_PER_EPOCH, EPOCHS = 3, 2


class _ReadAtEpochEnd(keras.callbacks.Callback):
    def __init__(self, log_dir, jsonl):
        super().__init__()
        self.log_dir, self.jsonl = log_dir, jsonl
        self.on_disk, self.in_jsonl = [], []

    def on_epoch_end(self, epoch, logs=None):
        steps = kgrad.read_logs(self.log_dir)["kgrad"]["scalars"]["grad_norm/hidden"].steps.tolist()
        self.on_disk.append(steps)
        # The sink's worker flushes after the records queued before it: wait for it, generously.
        expected, deadline = (epoch + 1) * STEPS_PER_EPOCH, time.monotonic() + 60
        while len(self._jsonl_steps()) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        self.in_jsonl.append(self._jsonl_steps())

    def _jsonl_steps(self):
        if not os.path.exists(self.jsonl):
            return []
        with open(self.jsonl, encoding="utf-8") as file:
            return [json.loads(line)["step"] for line in file if line.endswith("\n")]


def test_records_without_histograms_are_on_disk_at_each_epoch_end(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="hidden"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    log_dir, jsonl = str(tmp_path / "logs"), str(tmp_path / "kgrad.jsonl")
    probe = kgrad.GradientProbe(log_dir, every_n_steps=1, histograms=False,
                                sinks=[kgrad.JsonLinesSink(jsonl, histograms=False)])
    reader = _ReadAtEpochEnd(log_dir, jsonl)
    x = np.ones((STEPS_PER_EPOCH * 2, 3), "float32")
    model.fit(x, np.ones((len(x), 1)), batch_size=2, epochs=EPOCHS, verbose=0, callbacks=[probe, reader])
    expected = [list(range((epoch + 1) * STEPS_PER_EPOCH)) for epoch in range(EPOCHS)]
    assert reader.on_disk == expected
    assert reader.in_jsonl == expected
