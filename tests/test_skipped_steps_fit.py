"""A real fit with `NonFiniteGuard(skip_spikes=True)` and a transient fault, read back by `kgrad report`.

Runs where the guard can skip spikes (issue 55's step side); skipped otherwise. The
steps the report lists are the guard's own, and each one's leaders are the ranking of
the values the guard held in memory, read back from the event files.
"""

import inspect
import json

import keras
import numpy as np
import pytest

import kgrad
from kgrad.cli import main
from kgrad.report.spike_leaders import rank_skip_leaders

if "skip_spikes" not in inspect.signature(kgrad.NonFiniteGuard).parameters:
    pytest.skip("this NonFiniteGuard does not skip spikes (skip_spikes=)", allow_module_level=True)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("skipped_fit")
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(160 * 32, 8)).astype("float32")
    y = np.sin(x[:, :1]).astype("float32")
    x[120 * 32:122 * 32] *= 1000.0  # steps 120 and 121: a bad shard
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(1, name="out")(keras.layers.Dense(16, activation="tanh", name="hidden")(inputs))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    guard = kgrad.NonFiniteGuard(log_dir=log_dir, skip_spikes=True, spike_window=32)
    probe = kgrad.GradientProbe(log_dir, every_n_steps=10, histograms=False, overwrite=True)
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[probe, guard])
    return log_dir, guard


def test_the_report_lists_the_guards_skipped_steps_with_its_leaders(fitted, capsys):
    log_dir, guard = fitted
    assert guard.skipped_steps, "the planted fault was not skipped"
    (run,) = kgrad.health_report(kgrad.read_logs(log_dir))
    assert [step.step for step in run.skipped] == [skipped.step for skipped in guard.skipped_steps]
    for read, held in zip(run.skipped, guard.skipped_steps):
        expected = rank_skip_leaders(held.values, held.z_scores)
        assert [[(e.weight, e.value_name) for e in group] for group in read.leaders.groups] == [
            [(e.weight, e.value_name) for e in group] for group in expected.groups]
        for group, held_group in zip(read.leaders.groups, expected.groups):
            for entry, held_entry in zip(group, held_group):
                assert entry.z == pytest.approx(held_entry.z, rel=1e-6)
                assert entry.value == pytest.approx(held_entry.value, rel=1e-6)
    assert main(["report", str(log_dir)]) == 0
    out = capsys.readouterr().out
    assert f"skipped steps (the guard did not apply their update): {len(guard.skipped_steps)}" in out
    assert f"  step {guard.skipped_steps[0].step}: spike score " in out
    assert main(["report", str(log_dir), "--json"]) == 0
    (data,) = json.loads(capsys.readouterr().out)["runs"]
    assert [step["step"] for step in data["skipped_steps"]] == [step.step for step in guard.skipped_steps]
    assert data["skipped_steps"][0]["layers"][0][0]["layer"] == "hidden"  # the first layer takes the ×1000 input
