"""The `kgrad` command's refusals and endings: quick, one line, no traceback.

A closed pipe (``kgrad report ... | head -1``), a backend kgrad cannot probe on,
the demo's usage errors (answered before TensorFlow is imported), and Ctrl-C
whose ``KeyboardInterrupt`` a library swallowed.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from kgrad import cli, demo_command
from test_cli import write_run


# TensorFlow, Keras and JAX are installed (found) but fail when imported.
IMPORT_BLOCKER = """
import importlib.abc, importlib.machinery, sys

class Refuse(importlib.abc.Loader):
    def create_module(self, spec):
        raise ImportError(f"{spec.name} imported (blocked by the test)")

    def exec_module(self, module):
        pass

class BlockImports(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras", "jax"):
            return importlib.machinery.ModuleSpec(name, Refuse())
        return None

sys.meta_path.insert(0, BlockImports())
"""


@pytest.fixture
def flagged_logs(tmp_path):
    # Enough runs that the report is more than one write: a closed pipe fails one of them.
    for index in range(40):
        write_run(tmp_path / f"deep_{index}" / "kgrad", {"first": 1e-6, "last": 1.0})
    return str(tmp_path)


def _env(**extra):
    env = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), os.getcwd()]))
    return {**env, **extra}


def test_report_into_a_closed_pipe_exits_quietly_and_not_as_flagged(flagged_logs):
    # `| head -1` at its most abrupt: the reader is gone before the first line.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "kgrad.cli", "report", flagged_logs], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=300, env=_env())
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == cli.EXIT_CLOSED_PIPE == 141  # as a shell reports SIGPIPE; 1 means "flagged"


def test_report_piped_to_head_prints_its_first_line_only(flagged_logs):
    result = subprocess.run(f"{sys.executable} -m kgrad.cli report {flagged_logs} | head -1; "
                            "echo status ${PIPESTATUS[0]}", shell=True, executable="/bin/bash",
                            capture_output=True, text=True, timeout=300, env=_env())
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr
    first, status = result.stdout.splitlines()
    assert first.startswith("Thresholds: vanishing") and status in ("status 0", "status 1", "status 141")


@pytest.fixture
def stand_in_torch(tmp_path):
    """A `torch` package that imports, as if PyTorch were installed."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    return tmp_path


def test_the_demo_on_torch_is_refused_in_one_line_before_anything(tmp_path, stand_in_torch):
    log_dir = tmp_path / "demo-logs"
    env = _env(KERAS_BACKEND="torch")
    env["PYTHONPATH"] = os.pathsep.join([str(stand_in_torch), env["PYTHONPATH"]])
    check = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert check.stdout.strip() == "9.9.9"  # torch is "installed"
    result = subprocess.run([sys.executable, "-m", "kgrad.cli", "demo", "--log-dir", str(log_dir)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2
    assert result.stdout == ""  # no demo header
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("kgrad demo: error:")]
    assert "KERAS_BACKEND=torch: kgrad does not run on PyTorch yet" in error
    assert "KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax" in error
    assert "Traceback" not in result.stderr
    assert not log_dir.exists()


def test_the_backend_is_read_as_keras_reads_it(tmp_path, monkeypatch):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert demo_command.keras_backend_name() == "tensorflow"  # no keras.json
    (tmp_path / "keras.json").write_text('{"backend": "torch"}')
    assert demo_command.keras_backend_name() == "torch"
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert demo_command.keras_backend_name() == "jax"


def test_a_backend_that_is_not_installed_is_named_before_a_folder_is_made(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setattr(demo_command, "installed", lambda package: package != "jax")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--log-dir", str(tmp_path / "logs")])
    assert exit_info.value.code == 2
    assert "KERAS_BACKEND=jax needs 'jax', which is not installed" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("case", ["earlier logs", "a file in the way", "unwritable"])
def test_the_demos_usage_errors_answer_at_once_without_tensorflow(tmp_path, case):
    log_dir = tmp_path / "logs"
    if case == "earlier logs":
        (log_dir / "relu_deep" / "train").mkdir(parents=True)
        message = "The demo's run folder already holds logs"
    elif case == "a file in the way":
        log_dir.write_text("")
        message = "a file of that name is in the way"
    else:
        log_dir = "/proc/kgrad-demo"
        message = "cannot write the demo's logs to --log-dir '/proc/kgrad-demo'"
    (tmp_path / "sitecustomize.py").write_text(IMPORT_BLOCKER)
    env = _env(KERAS_BACKEND="tensorflow")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    blocked = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True, text=True, env=env,
                             timeout=60)
    assert "tensorflow imported (blocked by the test)" in blocked.stderr
    code = ("import sys\n"
            "from kgrad.cli import main\n"
            "try:\n    main(sys.argv[1:])\n"
            "finally:\n"
            "    print(sorted(m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code, "demo", "--log-dir", str(log_dir)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    # "At once": the refusal comes before any deep-learning framework is imported
    # (TensorFlow's import alone took 11-14 s on a busy machine). Asserted on what was
    # imported, not on a wall-clock time, which a loaded machine can stretch.
    assert result.stdout.split("\n")[-2] == "[]"


def test_ctrl_c_swallowed_by_a_library_still_ends_the_command_with_130(monkeypatch, capsys):
    # A KeyboardInterrupt raised inside a `__del__` is printed and dropped by Python;
    # here a library's `except KeyboardInterrupt: pass` stands in for it.
    def run(args):
        try:
            signal.raise_signal(signal.SIGINT)
            time.sleep(0)  # where Python runs the handler, at the latest
        except KeyboardInterrupt:
            pass
        assert demo_command.INTERRUPTED.is_set()
        return 0

    monkeypatch.setattr(demo_command, "run", run)
    # Python's own handler, or SIG_IGN where the suite was started in the background (`cmd &`).
    before = signal.getsignal(signal.SIGINT)
    assert cli.main(["demo"]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "\nkgrad demo: interrupted.\n"
    assert signal.getsignal(signal.SIGINT) is before  # put back


def test_the_demo_stops_at_the_next_batch_once_interrupted(tmp_path):
    import io
    import threading

    from kgrad import demo

    interrupted = threading.Event()
    interrupted.set()
    with pytest.raises(KeyboardInterrupt):
        demo.run_demo(str(tmp_path), epochs=1, samples=256, out=io.StringIO(), interrupted=interrupted)
