"""`benchmarks.step_memory` measures each compiled step's memory per device (one device here)."""

import json

from benchmarks import step_memory


def test_the_step_memory_benchmark_measures_every_step_against_keras(tmp_path, capsys):
    out = tmp_path / "memory.json"
    assert step_memory.main(["--out", str(out)]) == 0
    measured = json.loads(out.read_text())
    assert measured["split"] is False and set(measured["bytes"]) == set(step_memory.CONFIGS)
    keras_step = measured["bytes"]["keras"]
    # The MLP's state (weights and Adam's two moments, 2 × 2**21 + biases each) is in every step.
    assert keras_step > 3 * 2 * 2**21 * 4
    assert measured["bytes"]["guard"] <= 1.05 * keras_step  # issue 52's bound for the guard
    assert measured["bytes"]["default probe"] > keras_step
    assert "ratio to Keras' step" in capsys.readouterr().out
