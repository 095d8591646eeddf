"""`kgrad report`: every option changes what it prints; runs named as users name them; `--version`."""

import importlib.metadata
import os

import pytest
import tensorflow as tf

import kgrad
from kgrad import cli


def write_run(run_dir, grad_norms, zero_fractions=None):
    """A kgrad-like run: ``grad_norm/<layer>`` (and ``activation_zero_fraction/``) at steps 0, 10."""
    writer = tf.summary.create_file_writer(str(run_dir))
    with writer.as_default():
        for step in (0, 10):
            for layer, norm in grad_norms.items():
                tf.summary.scalar(f"grad_norm/{layer}", norm, step=step)
            for layer, fraction in (zero_fractions or {}).items():
                tf.summary.scalar(f"activation_zero_fraction/{layer}", fraction, step=step)
    writer.close()


# Each option of `kgrad report`, with a value that must change the output on the logs
# of `_options_logs`: `first` has a gradient norm of 1e-6 (vanishing at the default 1e-3,
# not at 1e-7) and 60% zero activations (dead at 0.5, not at the default 0.99); `last`
# has a norm of 1 (exploding above 0.9, not above the default 1000).
OPTION_VALUES = {
    "--vanishing-ratio": "1e-7",
    "--exploding-norm": "0.9",
    "--dead-fraction": "0.5",
    "--html": "{tmp}/report.html",
    "--json": None,  # a flag: prints the report as JSON
}


def _report_parser():
    (subparsers,) = [action for action in cli.build_parser()._actions if action.dest == "command"]
    return subparsers.choices["report"]


def _options_logs(tmp_path):
    log_dir = tmp_path / "logs"
    write_run(log_dir / "model" / "kgrad", {"first": 1e-6, "last": 1.0}, {"first": 0.6, "last": 0.0})
    return str(log_dir)


def _run_report(argv, capsys, tmp_path):
    """What a user sees: exit status, stdout, and the files the command wrote."""
    before = set(os.listdir(tmp_path))
    status = cli.main(argv)
    written = {name: (tmp_path / name).read_bytes() for name in set(os.listdir(tmp_path)) - before}
    return status, capsys.readouterr().out, written


def test_every_report_option_has_a_case_here():
    options = {
        option
        for action in _report_parser()._actions
        if action.option_strings and action.dest != "help"
        for option in action.option_strings
        if option.startswith("--")
    }
    assert options == set(OPTION_VALUES), "add the new option of `kgrad report` to OPTION_VALUES"


@pytest.mark.parametrize("option", sorted(OPTION_VALUES))
def test_every_report_option_changes_the_output(option, tmp_path, capsys):
    log_dir = _options_logs(tmp_path)
    plain = _run_report(["report", log_dir], capsys, tmp_path)
    value = OPTION_VALUES[option]
    value = [] if value is None else [value.format(tmp=tmp_path)]
    with_option = _run_report(["report", log_dir, option, *value], capsys, tmp_path)
    assert with_option != plain, f"`kgrad report {option} {' '.join(value)}` printed and wrote what it does without it"


def test_dead_fraction_flags_a_layer_with_that_many_zero_activations(tmp_path, capsys):
    log_dir = _options_logs(tmp_path)
    assert cli.main(["report", log_dir, "--vanishing-ratio", "1e-7"]) == 0
    assert "DEAD" not in capsys.readouterr().out
    assert cli.main(["report", log_dir, "--vanishing-ratio", "1e-7", "--dead-fraction", "0.5"]) == 1
    out = capsys.readouterr().out
    assert "DEAD" in out and "first (dead)" in out


@pytest.mark.parametrize("suffix", ["", "/", "/."])
def test_a_single_run_folder_is_named_by_the_folder(tmp_path, capsys, suffix):
    write_run(tmp_path / "run1", {"first": 0.5, "last": 1.0})
    assert cli.main(["report", str(tmp_path / "run1") + suffix]) == 0
    out = capsys.readouterr().out
    assert "run 'run1': 2 probes" in out and "'.'" not in out


def test_the_current_folder_as_a_run_is_named_by_the_folder(tmp_path, capsys, monkeypatch):
    write_run(tmp_path / "run1", {"first": 0.5, "last": 1.0})
    monkeypatch.chdir(tmp_path / "run1")
    assert cli.main(["report", "."]) == 0
    assert "run 'run1': 2 probes" in capsys.readouterr().out


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"kgrad {kgrad.__version__}\n"
    assert importlib.metadata.version("kgrad") == kgrad.__version__
