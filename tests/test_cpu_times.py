"""tests/cpu_times.py: each test's CPU seconds, its own and its subprocesses', per phase."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from cpu_times import main, ranking

HERE = pathlib.Path(__file__).resolve().parent

# Burns about `seconds` of CPU (not of waiting).
BURN = "def burn(seconds):\n    import time\n    end = time.process_time() + seconds\n    while time.process_time() < end:\n        pass\n"
TESTS = BURN + """
import subprocess, sys, time
import pytest

@pytest.fixture(scope="module")
def built_once():
    burn(0.4)

def test_burns(built_once):
    burn(0.3)

def test_sleeps(built_once):
    time.sleep(0.5)

def test_runs_a_subprocess():
    subprocess.run([sys.executable, "-c", {child!r}], check=True)
""".replace("{child!r}", repr(BURN + "burn(0.4)"))


def test_each_phase_counts_own_and_subprocess_cpu_seconds(tmp_path, capsys):
    (tmp_path / "test_inner.py").write_text(TESTS)
    # Not this run's PYTEST_* variables: under xdist, PYTEST_XDIST_WORKER would name the inner run's file.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env.update(KGRAD_TEST_CPU_TIMES=str(tmp_path / "times.json"), PYTHONPATH=str(HERE))
    subprocess.run([sys.executable, "-m", "pytest", "-p", "cpu_times", "-p", "no:cacheprovider", "-q", "test_inner.py"],
                   cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120)
    record = json.loads((tmp_path / "times.json").read_text())
    burns, sleeps, runs = (record["tests"][f"test_inner.py::{name}"]
                           for name in ("test_burns", "test_sleeps", "test_runs_a_subprocess"))
    # The module fixture is charged to the setup of the first test that asks for it.
    assert burns["setup"]["cpu"] >= 0.35 and sleeps["setup"]["cpu"] < 0.1
    assert burns["call"]["cpu"] >= 0.25 and burns["call"]["children_cpu"] == 0
    # Waiting is wall time, not CPU time: what another run's load would stretch.
    assert sleeps["call"]["wall"] >= 0.5 and sleeps["call"]["cpu"] < 0.1
    assert runs["call"]["children_cpu"] >= 0.35 and runs["call"]["cpu"] < 0.35
    assert set(burns) == {"setup", "call", "teardown"}
    assert record["process"]["cpu"] >= 0.65

    tests, modules, total = ranking([record])
    assert [nodeid.split("::")[1] for _, nodeid in tests] == ["test_burns", "test_runs_a_subprocess", "test_sleeps"]
    # One module holds every test; its sum and the total add the same seconds in another order.
    [(module_seconds, module)] = modules
    assert module == "test_inner.py" and module_seconds == pytest.approx(total) and total >= 1.1
    main([str(tmp_path / "times.json"), "--top", "1"])
    printed = capsys.readouterr().out
    assert "3 tests" in printed and "test_inner.py::test_burns" in printed and "test_sleeps" not in printed
