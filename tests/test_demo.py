"""The demo, reduced in size, and what `kgrad report` finds in its real logs."""

import io
import os

import pytest

import kgrad
from kgrad import demo
from kgrad.report import health as report


@pytest.fixture(scope="module")
def demo_logs(tmp_path_factory):
    log_dir = str(tmp_path_factory.mktemp("demo"))
    out = io.StringIO()
    accuracy = demo.run_demo(log_dir, epochs=1, samples=160, every_n_steps=2, out=out)
    return log_dir, out.getvalue(), accuracy


@pytest.mark.slow
def test_each_model_writes_keras_and_kgrad_runs(demo_logs):
    log_dir, _, accuracy = demo_logs
    assert sorted(accuracy) == ["relu_deep", "sigmoid_deep"]
    for run in ("relu_deep", "sigmoid_deep"):
        assert sorted(os.listdir(os.path.join(log_dir, run))) == ["kgrad", "train", "validation"]


@pytest.mark.slow
def test_progress_shows_every_epoch_with_the_first_layer_gradient(demo_logs):
    _, output, _ = demo_logs
    lines = output.splitlines()
    assert lines[0].startswith("[1/2] sigmoid_deep: 8 hidden sigmoid layers")
    assert sum(line.startswith("  epoch  1/1  loss ") for line in lines) == 2
    assert all("weight grad (dJ/dw) hidden_1 " in line for line in lines if line.startswith("  epoch"))


@pytest.mark.slow
def test_report_flags_the_sigmoid_model_as_vanishing_and_not_the_relu_model(demo_logs):
    runs = {run.run: run for run in report.health_report(kgrad.read_logs(demo_logs[0]))}
    assert sorted(runs) == ["relu_deep/kgrad", "sigmoid_deep/kgrad"]
    assert runs["relu_deep/kgrad"].flagged == ()
    sigmoid = runs["sigmoid_deep/kgrad"]
    flagged = [layer.layer for layer in sigmoid.flagged]
    # Vanishing starts at the layer farthest from the loss.
    assert flagged[0] == "hidden_1" and len(flagged) >= 2
    assert all(layer.flags == ("vanishing",) for layer in sigmoid.flagged)
    assert [layer.layer for layer in sigmoid.layers][-1] == "output"


def test_earlier_demo_logs_are_kept_unless_overwrite(tmp_path):
    old = tmp_path / "relu_deep" / "train"
    old.mkdir(parents=True)
    (old / "events.out.tfevents.old").write_text("")
    with pytest.raises(FileExistsError, match=r"already holds logs: '.*relu_deep'. Pass --overwrite"):
        demo.prepare_log_dir(str(tmp_path), overwrite=False)
    (tmp_path / "mine.txt").write_text("keep")
    demo.prepare_log_dir(str(tmp_path), overwrite=True)
    assert os.listdir(tmp_path) == ["mine.txt"]


def test_data_is_made_locally_and_balanced():
    x, y = demo.make_circle_data(2000, seed=3)
    assert x.shape == (2000, 2) and y.shape == (2000, 1)
    assert 0.45 < float(y.mean()) < 0.55


@pytest.mark.slow
def test_the_stated_shrink_per_layer_is_the_demos(tmp_path):
    """The docs' "about N× per layer": the geometric mean of ‖dJ/dw‖'s ratio, output down to hidden_1,
    in the demo as `kgrad demo` runs it (10 epochs; 2 epochs give 4.9)."""
    import pathlib
    import re

    demo.run_demo(str(tmp_path), out=io.StringIO())
    sigmoid = {run.run: run for run in report.health_report(kgrad.read_logs(str(tmp_path)))}["sigmoid_deep/kgrad"]
    norms = [layer.grad_norm for layer in sigmoid.layers]  # forward order: hidden_1 .. hidden_8, output
    measured = (norms[-1] / norms[0]) ** (1 / (len(norms) - 1))
    guide = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "report-and-tab.md").read_text()
    for stated in (re.search(r"shrink about ([\d.]+)× per layer", guide)[1],
                   re.search(r"shrink by about\s+([\d.]+)x per layer", demo.__doc__)[1]):
        assert float(stated) == pytest.approx(measured, rel=0.05)
