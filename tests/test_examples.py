"""The scripts in examples/ run, and the gradients they print are right."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
NUMBER = r"([-+0-9.e]+)"


@pytest.fixture
def run(preloaded_python, tmp_path_factory):
    """``run(script, *arguments) -> stdout``: the example in a fresh process, in a folder of its own.

    The process is a fork of one that imported Keras and kgrad (tests/forked_python.py):
    as `python examples/<script>` after those imports, without their ~6 CPU-s each time.
    """
    def run(script, *arguments):
        folder = tmp_path_factory.mktemp(script.removesuffix(".py"))
        status, stdout, stderr = preloaded_python.run_script(EXAMPLES / script, arguments, folder, timeout=120)
        assert status == 0, stderr[-3000:]
        return stdout

    return run


def _numbers(pattern, text):
    return [float(value) for value in re.findall(pattern, text)]


def test_prediction_gradient_example_shows_the_trap_and_the_answer(run):
    out = run("prediction_gradient.py")
    assert "tape.gradient(loss, predictions) = None" in out
    (error,) = _numbers(rf"max \|kgrad - closed form \(1 - y/p\)/batch\| = {NUMBER}", out)
    assert error < 1e-6
    # The printed dJ/dŷ matrix: 4 rows of 3, entries 1/4 where y = 0.
    rows = re.findall(r"^\s*\[+\s*([-0-9. ]+?)\s*\]+$", out.split("dJ/d(predictions) =")[1], re.M)
    matrix = [[float(v) for v in row.split()] for row in rows[:4]]
    assert len(matrix) == 4 and all(len(row) == 3 for row in matrix)
    assert sum(value == 0.25 for row in matrix for value in row) == 8
    # Inside the custom train_step, during fit.
    losses = _numbers(rf"epoch \d: loss={NUMBER}", out)
    norms = _numbers(rf"\|dJ/d\(predictions\)\|={NUMBER}", out)
    assert len(losses) == len(norms) == 3
    assert losses[-1] < losses[0] and all(norm > 0 for norm in norms)


def test_input_gradient_example_ascends_the_class_probability(run):
    out = run("input_gradient.py")
    shape, norm = re.search(r"dJ/d\(input\): shape \(([0-9, ]+)\), norm " + NUMBER, out).groups()
    assert shape == "1, 32, 32, 3" and float(norm) > 0
    (error,) = _numbers(rf"max \|kgrad - tf.GradientTape.watch\(input\)\| = {NUMBER}", out)
    assert error < 1e-6
    probabilities = _numbers(rf"step \d: p\(class 3\)={NUMBER}", out)
    (final,) = _numbers(rf"final: p\(class 3\)={NUMBER}", out)
    assert len(probabilities) == 6
    assert final > probabilities[0] + 0.3


def test_layer_gradient_example_matches_the_chain_rule(run):
    out = run("layer_gradient.py")
    assert "operations: ['input_layer', 'dense', 'sin', 'cos', 'add', 'head']" in out
    assert "tape.watch(model.layers[1].output) fails: ValueError" in out
    errors = dict(re.findall(rf"max \|kgrad - chain rule\| for (\w+): {NUMBER}", out))
    assert set(errors) == {"sin", "cos", "dense"}
    assert all(float(error) < 1e-6 for error in errors.values())
    for name in ("sin", "dense"):
        block = out.split(f"dJ/d({name} output) =")[1]
        first_two_rows = " ".join(block.split("\n")[1:3])
        values = [float(v) for v in re.findall(r"-?\d+\.\d+", first_two_rows)]
        assert len(values) == 8 and any(value != 0.0 for value in values)


def test_noise_scale_example_shows_the_noise_scale_growing(run, tmp_path):
    out = run("noise_scale.py", str(tmp_path / "noise"))
    finite = _numbers(r"step \d+: B_simple ([-+0-9.e]+), SNR", out)
    unknown = re.findall(r"step \d+: B_simple not estimated yet", out)
    assert len(finite) + len(unknown) == 8 and len(finite) >= 6
    assert "nan" not in out
    assert finite[-1] > 5 * finite[0]
    assert all(later > earlier for earlier, later in zip(finite, finite[1:]))
    report = subprocess.run(
        [sys.executable, "-m", "kgrad.cli", "report", str(tmp_path / "noise")],
        capture_output=True, text=True, timeout=120, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""),
    )
    assert "critical batch size (B_simple, whole model" in report.stdout
    assert "vs batch size 64 in use" in report.stdout
