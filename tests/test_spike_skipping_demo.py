"""The false-alarm rate of `NonFiniteGuard(skip_spikes=True)` on `kgrad demo`'s models: no skip.

The demo's two MLPs (`kgrad.demo`: the same data, seeds and fit as `kgrad demo`), trained for
20 epochs (2060 steps each) with the guard skipping spikes at its defaults instead of a probe.
Backend-free: tests/jax/test_spike_skipping_jax.py runs it on JAX.
"""

import keras
import pytest

import kgrad
from kgrad import demo


# Judged on the values themselves (OLMo-core's rule), relu_deep (SGD with momentum 0.9, 32
# examples a batch) crossed 6σ at step 304 on TensorFlow (14 steps, scores up to 12.4) and at
# step 568 on JAX; judged on their logarithms, its largest score is 2.7 (3.2 on JAX).
_CASES = list(enumerate(demo.MODELS, start=1))


@pytest.mark.slow
@pytest.mark.parametrize("index, run", _CASES)
def test_no_step_of_the_demos_models_is_skipped(index, run):
    x, y = demo.make_circle_data(4096)
    keras.utils.set_random_seed(index)
    model = demo.build_mlp(*demo.MODELS[run])
    guard = kgrad.NonFiniteGuard(skip_spikes=True)
    model.fit(x, y, batch_size=32, epochs=20, validation_split=0.2, callbacks=[guard], verbose=0)
    rows = guard._spikes.logs[None].rows
    scores = [row["global/spike_score"] for _, row in rows if "global/spike_score" in row]
    assert len(rows) == 20 * 103 and guard.skipped_steps == [], (run, max(scores))
