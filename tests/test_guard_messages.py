"""The guard's stop message can be copied: the code it prints runs as printed, and a replay
that cannot be rebuilt from its files says which layer, why, and what to do instead."""

import os
import subprocess
import sys

import keras
import numpy as np

import kgrad


def _trip(tmp_path, middle, scale_row=None):
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    x[20] *= 300.0
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="d"), middle,
                              keras.layers.Dense(1, name="out")])
    model.compile("sgd", "mse")
    guard = kgrad.NonFiniteGuard(dump_dir=str(tmp_path / "nan_dump"))
    model.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[guard])
    return guard.report


def test_the_printed_replay_lines_come_last_and_run_as_printed(tmp_path, capsys):
    report = _trip(tmp_path, keras.layers.Activation("exponential", name="exp"))
    printed = capsys.readouterr().err
    assert printed.startswith("kgrad.NonFiniteGuard stopped training: ")
    head, _, code = printed.rstrip("\n").partition("\nTo replay it, run:\n")
    # The closing sentence is before the code, not glued to its last line.
    assert head.endswith("The weights are those of the last finite step.")
    assert code == report.reproduce and len(code.splitlines()) == 3
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.getcwd())
    assert done.returncode == 0, done.stderr[-2000:]
    assert "born in the forward pass at 'exp'" in done.stdout


def test_an_inline_lambda_that_cannot_be_rebuilt_is_named_and_no_code_is_printed(tmp_path, capsys):
    report = _trip(tmp_path, keras.layers.Lambda(lambda t: keras.ops.exp(t), name="inline"))
    printed = capsys.readouterr().err
    assert report.born_at == "inline" and report.reproduce is None
    assert "To replay it" not in printed
    note = report.replay_note
    assert "Lambda layer 'inline' holds an inline `lambda`" in note
    assert "NameError: name 'keras' is not defined" in note
    assert "@keras.saving.register_keras_serializable()" in note and "kgrad.replay_step(model, batch)" in note
    assert "\x1b[" not in note  # no terminal escapes from Keras' message
    assert sorted(os.listdir(tmp_path / "nan_dump")) == ["step_2.keras", "step_2.npz"]
