"""The `kgrad` command line: exit status, output, usage errors."""

import os
import signal
import subprocess
import sys

import pytest
import tensorflow as tf

from kgrad import cli, demo, demo_command


def write_run(run_dir, norms):
    """A kgrad-like run: ``grad_norm/<layer>`` at steps 0 and 10."""
    writer = tf.summary.create_file_writer(str(run_dir))
    with writer.as_default():
        for step in (0, 10):
            for layer, norm in norms.items():
                tf.summary.scalar(f"grad_norm/{layer}", norm, step=step)
    writer.close()


@pytest.fixture
def healthy(tmp_path):
    write_run(tmp_path / "model" / "kgrad", {"first": 0.5, "last": 1.0})
    return str(tmp_path)


@pytest.fixture
def vanishing(tmp_path):
    write_run(tmp_path / "deep" / "kgrad", {"first": 1e-6, "last": 1.0})
    write_run(tmp_path / "fine" / "kgrad", {"first": 0.5, "last": 1.0})
    return str(tmp_path)


def test_report_healthy_exits_0(healthy, capsys):
    assert cli.main(["report", healthy]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "Thresholds: vanishing: the layer's gradient norm 0 or < 0.001 x the largest layer's"
    )
    assert "run 'model/kgrad': 2 probes, steps 0..10" in out
    assert out.rstrip().endswith("OK: no layer flagged in 1 run.")


def test_report_flagged_exits_1_with_one_table_per_run(vanishing, capsys):
    assert cli.main(["report", vanishing]) == cli.EXIT_FLAGGED == 1
    out = capsys.readouterr().out
    assert "run 'deep/kgrad'" in out and "run 'fine/kgrad'" in out
    assert out.rstrip().endswith("PROBLEMS in 1 of 2 runs. deep/kgrad: first (vanishing)")


def test_report_thresholds_are_options(vanishing, capsys):
    assert cli.main(["report", vanishing, "--vanishing-ratio", "1e-7"]) == 0
    assert "vanishing: the layer's gradient norm 0 or < 1e-07 x" in capsys.readouterr().out
    assert cli.main(["report", vanishing, "--exploding-norm", "0.9"]) == 1
    assert "EXPLODING" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "{tmp}/missing"], "`log_dir` does not exist: log_dir='{tmp}/missing'"),
        (
            ["report", "{tmp}/keras_only"],
            "no kgrad logs under LOG_DIR='{tmp}/keras_only' (only runs without kgrad tags: 'train')",
        ),
        (["report", "{tmp}/empty"], "no kgrad logs under LOG_DIR='{tmp}/empty' (no event files)"),
        (
            ["report", "{tmp}", "--vanishing-ratio", "2"],
            "argument --vanishing-ratio: must be a number in (0, 1), received '2'",
        ),
        (
            ["report", "{tmp}", "--exploding-norm", "-3"],
            "argument --exploding-norm: must be a positive number, received '-3'",
        ),
        (
            ["report", "{tmp}", "--dead-fraction", "lots"],
            "argument --dead-fraction: must be a number in (0, 1], received 'lots'",
        ),
        (["demo", "--epochs", "0"], "argument --epochs: must be a positive integer, received '0'"),
        (["report"], "the following arguments are required: LOG_DIR"),
        (["explain"], "invalid choice: 'explain'"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    write_scalar_run = tf.summary.create_file_writer(str(tmp_path / "keras_only" / "train"))
    with write_scalar_run.as_default():
        tf.summary.scalar("epoch_loss", 1.0, step=0)
    write_scalar_run.close()
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == cli.EXIT_USAGE == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "demo" in err and "report" in err


def test_demo_command_runs_the_demo_and_says_how_to_look(tmp_path, capsys, monkeypatch):
    # Training is tested in test_demo.py; here, what the command adds to it.
    calls = []

    def fake_run_demo(log_dir, epochs, overwrite, out, interrupted):
        calls.append((log_dir, epochs, overwrite))
        return {"sigmoid_deep": 0.5, "relu_deep": 0.97}

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    log_dir = str(tmp_path / "demo logs")
    assert cli.main(["demo", "--log-dir", log_dir, "--epochs", "3"]) == 0
    assert calls == [(log_dir, 3, False)]
    out = capsys.readouterr().out
    assert "Final training accuracy: sigmoid_deep 0.50, relu_deep 0.97." in out
    assert f"tensorboard --logdir '{log_dir}'" in out
    assert f"kgrad report '{log_dir}'" in out


def test_demo_command_names_a_backend_that_is_not_installed(tmp_path, capsys, monkeypatch):
    # KERAS_BACKEND=jax without JAX: Keras' import fails; the command says what to install.
    def missing_jax(name):
        raise ModuleNotFoundError("No module named 'jax'", name="jax")

    monkeypatch.setattr(demo_command, "import_quietly", missing_jax)
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--log-dir", str(tmp_path / "logs")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "KERAS_BACKEND=jax needs 'jax', which is not installed. Install it (pip install jax" in err
    assert "Traceback" not in err
    assert not (tmp_path / "logs").exists()  # no empty folder left


def test_demo_command_keeps_earlier_logs(tmp_path, capsys):
    (tmp_path / "sigmoid_deep" / "train").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--log-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "Pass --overwrite to replace them, or another --log-dir" in capsys.readouterr().err


def test_installed_console_script(vanishing):
    script = os.path.join(os.path.dirname(sys.executable), "kgrad")
    if not os.path.exists(script):
        pytest.skip(f"no `kgrad` script beside {sys.executable}; run `pip install -e .`")
    result = subprocess.run(
        [script, "report", vanishing],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 1, result.stderr
    assert "VANISHING" in result.stdout


def _kgrad(*arguments, timeout=120):
    """``python -m kgrad.cli ARGUMENTS`` in a subprocess, as a user runs it."""
    # Without TF_CPP_MIN_LOG_LEVEL: quiet is the command's own doing.
    env = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-m", "kgrad.cli", *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_report_prints_no_tensorflow_start_up_lines(vanishing):
    result = _kgrad("report", vanishing)
    assert result.returncode == 1 and "VANISHING" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("argv", [["--help"], ["report", "--help"], ["demo", "--help"]])
def test_help_answers_without_importing_tensorflow(argv):
    code = (
        "import sys\n"
        "from kgrad import cli\n"
        f"try:\n    cli.main({argv!r})\nexcept SystemExit as exit:\n    assert exit.code == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"
    assert "usage: kgrad" in result.stdout and result.stderr == ""


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["demo", "--log-dir", "{file}/logs"],
            "cannot write the demo's logs to --log-dir '{file}/logs' (Not a directory",
        ),
        (
            ["demo", "--log-dir", "/proc/kgrad-demo"],
            "cannot write the demo's logs to --log-dir '/proc/kgrad-demo' (",
        ),
        (["demo", "--log-dir", "{file}"], "(a file of that name is in the way). Pass --log-dir a folder"),
        (["demo", "--epochs", "-1"], "argument --epochs: must be a positive integer, received '-1'"),
        (["demo", "--bogus"], "unrecognized arguments: --bogus"),
        (["report", "{file}"], "error:"),
        (["report"], "the following arguments are required: LOG_DIR"),
    ],
)
def test_usage_errors_reach_the_user_as_one_line_without_a_traceback(tmp_path, argv, message):
    file = tmp_path / "a_file"
    file.write_text("not a folder")
    result = _kgrad(*(argument.format(file=file) for argument in argv))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (error_line,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert message.format(file=file) in error_line
    assert not os.path.exists(file.parent / "sigmoid_deep")


def test_ctrl_c_ends_the_demo_with_one_line_and_status_130(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "kgrad.cli", "demo", "--log-dir", str(tmp_path)],
        env={name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while "[1/2]" not in process.stdout.readline():  # training has started
            assert process.poll() is None, process.stderr.read()
        process.send_signal(signal.SIGINT)
        # Waits for the process to end (the timeout only keeps a hung one from hanging CI).
        _, err = process.communicate(timeout=900)
    finally:
        process.kill()
    assert process.returncode == cli.EXIT_INTERRUPTED == 130
    # One line, and no TensorFlow start-up lines before it either.
    assert err == "\nkgrad demo: interrupted.\n"
