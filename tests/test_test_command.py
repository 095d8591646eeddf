"""The README's test command runs both halves (TensorFlow, then JAX) and fails if either failed;
`.ci/run` runs the same lines."""

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _readme_test_lines():
    """The lines of the README's test command after its install line."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    (block,) = [block for block in blocks if "pytest" in block]
    lines = block.strip().splitlines()
    assert lines[0].startswith(". .venv/bin/activate && pip install")
    return lines[1:]


def test_ci_runs_the_readmes_test_command():
    # .ci/run turns `set -e` off around them (else the first half's failure would end it).
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line not in ("set -e", "set +e")]
    lines = _readme_test_lines()
    start = ci.index(lines[0])
    assert ci[start:start + len(lines)] == lines


@pytest.mark.parametrize("failing", [None, "tensorflow", "jax", "both"])
def test_both_halves_run_and_either_failure_fails_the_command(tmp_path, failing):
    # `python` stands in for pytest: it records which half ran, and fails as told.
    stand_in = (
        "python() {\n"
        '  half=${KERAS_BACKEND:-tensorflow}; echo "$half" >> ran.txt\n'
        f'  case "{failing}" in "$half"|both) return 1;; esac\n'
        "}\n"
    )
    script = stand_in + "\n".join(_readme_test_lines()) + "\n"
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (tmp_path / "ran.txt").read_text().split() == ["tensorflow", "jax"]
    assert (result.returncode == 0) == (failing is None), result.stderr


@pytest.mark.parametrize("failing", [None, "tensorflow", "jax", "both"])
def test_ci_run_fails_when_either_half_failed(tmp_path, failing):
    # .ci/run's lines from its install to the wheel smoke test, under `set -euo pipefail` as
    # .ci/run runs them (a failure left of `&&` does not end a `set -e` script by itself).
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    start = ci.index("set +e")
    end = next(i for i, line in enumerate(ci) if line.startswith(".ci/wheel_smoke.sh"))
    stand_in = (
        "python() {\n"
        '  half=${KERAS_BACKEND:-tensorflow}; echo "$half" >> ran.txt\n'
        f'  case "{failing}" in "$half"|both) return 1;; esac\n'
        "}\n"
    )
    script = "set -euo pipefail\n" + stand_in + "\n".join(ci[start:end]) + "\necho reached-the-wheel-test\n"
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (tmp_path / "ran.txt").read_text().split() == ["tensorflow", "jax"]
    assert (result.returncode == 0) == (failing is None), result.stderr
    assert ("reached-the-wheel-test" in result.stdout) == (failing is None)
