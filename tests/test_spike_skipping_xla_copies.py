"""Spike skipping under TensorFlow's XLA copies no weight or Adam moment on a step (`guard/xla_measure.py`).

A copy in the entry computation of the compiled step runs on every step,
whichever branch the step takes. The skip's and the sample's measures read
the weights and moments beside the update that writes them in place; unless
XLA knows their order, it copies the whole state first: 1.12–1.14 of the
guard's time on the benchmark MLP (benchmarks/RESULTS.md). The compiled
programs are read in a process of their own (`tests/scripts/xla_copies_tf.py`):
XLA reads its dump flags once.
"""

import json
import os
import subprocess
import sys

import keras
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "xla_copies_tf.py")


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's XLA step")
def test_the_skipping_guards_xla_step_copies_what_the_guards_copies():
    done = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, env=dict(os.environ),
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    for step in ("", " (own train_step)"):  # Keras' step, and a model's own through a kgrad.ProbeTape
        guard, skipping = measured["guard" + step], measured["skip_spikes" + step]
        # The guard's copies are the batch's; the rule's own state adds a few rows of scalars.
        assert guard["entry_copy_bytes"] < 0.1 * guard["state_bytes"], measured
        assert skipping["entry_copy_bytes"] <= guard["entry_copy_bytes"] + 4096, measured
