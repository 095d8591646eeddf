"""`kgrad report` lists the steps a NonFiniteGuard skipped, with their leading layers (table and --json).

The run's event files are written with kgrad's own writer (tests/skipped_logs.py) under the
guard's tag contract, and read back as `kgrad report` reads them.
"""

import json

import pytest

import kgrad
from kgrad.cli import main
from skipped_logs import SKIP_VALUES, SKIPPED, write_skipped_run


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("skipped")
    write_skipped_run(folder / "run" / "kgrad")
    return folder


def _layers(leaders):
    return [[entry.layer for entry in group] for group in leaders.layers()]


def test_the_skipped_steps_are_read_back_with_their_window_and_leaders(log_dir):
    (run,) = kgrad.health_report(kgrad.read_logs(log_dir))
    assert [step.step for step in run.skipped] == list(SKIPPED)
    first, second = run.skipped
    assert (first.spike_score, first.log_loss_mean, first.log_loss_std) == (9.0, 1.0, pytest.approx(0.05))
    assert (first.log_grad_norm_mean, first.log_grad_norm_std) == (0.5, pytest.approx(0.1))
    # Step 18: zeta (z 41) and alpha (z 40.5) cannot be told apart: a tie, then the query.
    assert _layers(first.leaders) == [["zeta", "alpha"], ["block/mha/query"], ["block/mha/key"]]
    # The key bias's z-scores (900, 800) are the largest, but its gradient is rounding noise.
    for step in run.skipped:
        scored = {entry.weight for group in step.leaders.groups for entry in group}
        assert scored == set(SKIP_VALUES[step.step]) - {"block/mha/key/bias"}
        ((weight, reason),) = step.leaders.not_scored
        assert weight == "block/mha/key/bias" and reason.startswith("rounding noise")
    assert _layers(second.leaders)[0] == ["alpha"]
    top = second.leaders.groups[0]
    assert [(entry.value_name, entry.z, entry.value) for entry in top] == [
        ("update_ratio", 70.0, pytest.approx(0.9)), ("grad_norm", 64.0, 2.0)]


def test_kgrad_report_lists_them_in_the_table(log_dir, capsys):
    assert main(["report", str(log_dir)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = lines.index("skipped steps (the guard did not apply their update): 2")
    assert lines[start + 1].startswith(
        "  step 18: spike score 9 (ln loss window 1 ± 0.05); moved most (above 6σ of their history), largest "
        "first: 2 tied: zeta (grad_norm of kernel z 41, 0.9), alpha (grad_norm of kernel z 40.5, 0.1); "
        "block/mha/query (grad_norm of kernel z 12, 0.5)")
    assert lines[start + 2].startswith("    not scored: block/mha/key/bias (rounding noise: gradient norm 3e-10")
    assert lines[start + 3].startswith("  step 27: spike score 9 (ln loss window 1 ± 0.05); moved most (above 6σ "
                                       "of their history), largest first: alpha (update_ratio of kernel z 70")
    assert "block/mha/key adam_rms" not in out
    assert lines[-1] == "No layer flagged in 1 run; 1 loss spike (stability, above); 2 steps skipped by the guard (above)."


def test_kgrad_report_json_holds_them(log_dir, capsys):
    assert main(["report", str(log_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (run,) = data["runs"]
    first, second = run["skipped_steps"]
    assert (first["step"], first["spike_score"], first["window"]["log_loss_mean"]) == (18, 9.0, 1.0)
    assert [[entry["layer"] for entry in group] for group in first["layers"]] == [
        ["zeta", "alpha"], ["block/mha/query"], ["block/mha/key"]]
    assert first["leaders"][0][0] == {"layer": "zeta", "weight": "zeta/kernel", "value_name": "grad_norm",
                                      "z": 41.0, "value": pytest.approx(0.9)}
    assert [item["weight"] for item in first["not_scored"]] == ["block/mha/key/bias"]
    assert first["words"].startswith("moved most")
    assert second["layers"][0][0]["layer"] == "alpha"
    # The loss spike's leaders as ties with their sizes (σ), never as an order.
    (spike,) = run["stability"]["loss_spikes"]
    assert spike["step"] == 30
    (tie,) = spike["first"]
    assert (tie["step"], tie["probes_ahead"], tie["at_once"]) == (29, 1, 1)
    assert tie["signals"][0]["layer"] == "alpha" and tie["signals"][0]["sigmas"] > 6


def test_a_run_without_the_guard_lists_nothing_and_a_guard_only_run_is_a_kgrad_run(tmp_path):
    from kgrad.report import skipped_steps

    assert skipped_steps.describe(()) == [] and skipped_steps.skipped_steps({}) == ()
    write_skipped_run(tmp_path / "run" / "kgrad", stability=False)
    (run,) = kgrad.health_report(kgrad.read_logs(tmp_path))
    assert [step.step for step in run.skipped] == list(SKIPPED) and run.stability.loss_spikes == ()


def test_a_skipped_step_without_a_score_says_why_rather_than_a_number():
    """A norm beyond float32's squares spikes with no score (tests/test_spike_skipping_overflow.py)."""
    from kgrad.report.skipped_steps import SkippedStep, describe

    (_, line) = describe([SkippedStep(36, why="no per-weight values were logged")])
    assert line.startswith("  step 36: spike score not logged (none is where it cannot be computed")
    assert "beyond float32's sums of squares" in line and "nan" not in line.lower()
