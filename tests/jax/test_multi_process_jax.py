"""Two JAX processes (4 CPU devices each, `jax.distributed`) train one model split over all 8 (issue 52).

One pair of processes of tests/scripts/multi_process_jax.py (coordinator on
127.0.0.1), three fits: a probed one, a guarded one with a NaN in the data
that only process 1 holds (its trip replayed by both processes together, and
`kgrad.replay_step` of a batch that overflows a layer), and a long probed one
during which the test kills process 1. Only process 0 writes; both read back
only what they hold (JAX refuses to read an array that spans another process's
devices); the values and the replays' findings are those of one process with
the whole batch (this process, one device); `kgrad report` and the tab's
plugin read process 0's logs.
"""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import kgrad
from kgrad import cli
from kgrad.dashboard.events import guard_reports, read_run

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
sys.path.insert(0, SCRIPTS)
import multi_process_jax  # noqa: E402  (the model and the data, for the one-process reference)


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _lines(path):
    with open(path) as file:
        return [line.strip() for line in file]


def _wait_for(condition, what, timeout):
    """Polls ``condition()`` (the timeout only stops a hung run)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not in {timeout} s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("processes")
    port = str(_free_port())
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    processes, files = [], []
    for process in (0, 1):
        files += [open(out / f"stdout_{process}", "w"), open(out / f"stderr_{process}", "w")]
        script = os.path.join(SCRIPTS, "multi_process_jax.py")
        processes.append(subprocess.Popen([sys.executable, script, str(process), port, str(out)],
                                          stdout=files[-2], stderr=files[-1], env=environment))
    first, second = processes
    try:
        # The long fit has run a few steps: kill process 1 in the middle of it.
        _wait_for(lambda: _long_fit_steps(_lines(out / "stdout_0")) >= 3 or first.poll() is not None,
                  "process 0's long fit", timeout=600)
        assert first.poll() is None, (out / "stderr_0").read_text()[-3000:]
        second.kill()
        second.wait(timeout=60)
        # Process 0's collective fails; it ends once the distributed service misses process 1.
        first.wait(timeout=300)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for file in files:
            file.close()
    return out, _lines(out / "stdout_0"), first.returncode


def _long_fit_steps(lines):
    """The steps process 0's long fit said it ran (``step N`` after ``guard done``)."""
    if "guard done" not in lines:
        return 0
    return len([line for line in lines[lines.index("guard done") + 1:] if line.startswith("step ")])


def test_only_process_0_writes(run):
    out, _, _ = run
    written = sorted(path.name for path in out.iterdir() if path.is_dir())
    assert written == ["guard_0", "long_0", "probe_0"]
    assert os.listdir(out / "probe_0" / "kgrad")


def records(path):
    with open(path) as file:
        return json.load(file)


def _json(value):
    """``value`` as it reads back from JSON (tuples as lists)."""
    return json.loads(json.dumps(value))


def test_the_values_are_one_processs(run):
    out, _, _ = run
    first, second = records(out / "records_0.json"), records(out / "records_1.json")
    assert second == first  # both read the records back: small arrays every process holds
    model = multi_process_jax.build(None)
    expected = []
    model.fit(multi_process_jax.features, multi_process_jax.labels, batch_size=multi_process_jax.GLOBAL_BATCH,
              shuffle=False, verbose=0, callbacks=[multi_process_jax.probe(on_probe=expected.append)])
    assert [r["step"] for r in first] == [r.step for r in expected] == [0, 1]
    for split, one in zip(first, expected):
        assert split["scalars"].keys() == one.scalars.keys()
        wanted = {"weight_grad_norm/up/kernel", "adam_rms/down/kernel", "update_ratio/up/kernel"}
        assert wanted <= one.scalars.keys()
        for tag, value in one.scalars.items():
            if "zero_fraction" in tag or "nonfinite" in tag:
                assert split["scalars"][tag] == value, tag
            else:
                assert split["scalars"][tag] == pytest.approx(value, rel=1e-5, abs=1e-7), tag
        assert split["histograms"].keys() == one.histograms.keys() and one.histograms
        for tag, buckets in one.histograms.items():
            got, want = np.array(split["histograms"][tag]), np.asarray(buckets)
            np.testing.assert_allclose(got[:, :2], want[:, :2], rtol=1e-6, err_msg=tag)
            # Fixed edges: a value moves bucket only where the split sums rounded it across one.
            assert np.abs(np.cumsum(got[:, 2]) - np.cumsum(want[:, 2])).max() <= 1, tag


def test_kgrad_report_reads_the_run(run, capsys):
    out, _, _ = run
    assert cli.main(["report", str(out / "probe_0")]) == 0
    printed = capsys.readouterr().out
    assert "2 probes, steps 0..1" in printed and "up" in printed and "down" in printed


def test_the_tab_serves_the_run_with_process_0s_values(run):
    import base64

    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client

    from kgrad.dashboard.plugin import KgradPlugin

    out, _, _ = run
    apps = KgradPlugin(base_plugin.TBContext(logdir=str(out / "probe_0"))).get_plugin_apps()

    def get(route, **query):
        response = Client(apps[f"/{route}"]).get(f"/{route}", query_string=query)
        assert response.status_code == 200, response.get_data(as_text=True)
        return json.loads(response.get_data())

    assert get("runs")["runs"] == ["kgrad"]
    assert (get("summary", run="kgrad")["probes"], get("summary", run="kgrad")["last_step"]) == (2, 1)
    heatmap = get("heatmap", run="kgrad", quantity="grad")
    assert heatmap["steps"] == [0, 1] and {"up", "down"} <= set(heatmap["layers"])
    shown = np.frombuffer(base64.b64decode(heatmap["values"]), "<f4").reshape(len(heatmap["layers"]), -1)
    written = records(out / "records_0.json")
    for row, layer in zip(shown, heatmap["layers"]):
        np.testing.assert_allclose(row, [r["scalars"][f"grad_norm/{layer}"] for r in written], rtol=1e-6)


@pytest.fixture(scope="module")
def after_step_0():
    """One process's model after the guarded fit's step 0 on its whole batch: the state the guard kept."""
    model = multi_process_jax.build(None)
    model.fit(multi_process_jax.features[:8], multi_process_jax.labels[:8], batch_size=8, verbose=0)
    return model


def test_a_guard_trip_stops_both_and_process_0_writes_the_report(run, after_step_0):
    out, _, _ = run
    reports = [records(out / f"guard_{process}.json") for process in (0, 1)]
    # Both stopped at the NaN's step, without its update (the NaN is in process 1's half of the batch).
    assert reports[0] == reports[1]
    assert reports[0]["iterations"] == 1 and reports[0]["step"] == 1 and reports[0]["tensor"] == "loss/loss"
    (written,) = guard_reports(read_run(sorted((out / "guard_0" / "kgrad").iterdir())))
    assert written["step"] == 1 and written["tensor"] == "loss/loss"
    # Counted on the devices of both processes. The NaN of one example's feature 3 reaches every
    # output of `up` (relu passes NaN on, but its gradient there is 0): row 3 of up's kernel (64
    # NaN gradients), all of down's kernel (64 x 8) and bias (8); up's bias gets 0s, no NaN.
    assert written["non_finite"] == [["loss/loss", 1, 0], ["weight_grad/up/kernel", 64, 0],
                                     ["weight_grad/down/kernel", 512, 0], ["weight_grad/down/bias", 8, 0]]

    # The replay ran on both processes together, each batch and weight where it lies, and names what
    # one process replaying the same step (the weights after step 0, the whole batch) names.
    bad = multi_process_jax.features.copy()
    bad[multi_process_jax.NAN_AT] = np.nan
    one = kgrad.replay_step(after_step_0, (bad[8:], multi_process_jax.labels[8:]), step=1)
    assert (one.born_in, one.born_at) == ("data", "input")
    for field in multi_process_jax.BORN:
        assert written[field] == reports[0][field] == _json(getattr(one, field)), field
    # A dump would hold the whole model and batch, which no process holds: refused before any step
    # (test_only_process_0_writes: no dump folder).
    assert "NonFiniteGuard(dump_dir=" in reports[0]["dump_refusal"]
    assert "with 2 JAX processes" in reports[0]["dump_refusal"]


def test_a_killed_process_leaves_process_0s_logs_readable_up_to_its_last_step(run):
    out, lines, status = run
    assert status != 0  # its collective failed: it did not train on alone
    last = _long_fit_steps(lines) - 1
    assert last >= 2
    scalars = kgrad.read_logs(str(out / "long_0"))["kgrad"]["scalars"]
    steps = scalars["global/grad_norm"].steps.tolist()
    assert steps[: last + 1] == list(range(last + 1)) and steps == list(range(len(steps)))
    assert np.isfinite(scalars["global/grad_norm"].values).all()


def test_the_replay_of_several_processes_names_the_layer_one_process_names(run, after_step_0):
    """`kgrad.replay_step` of a step whose Inf is born in a layer, run by both processes on their halves."""
    out, _, _ = run
    reports = [records(out / f"guard_{process}.json")["replay_step"] for process in (0, 1)]
    assert reports[0] == reports[1]
    one = kgrad.replay_step(after_step_0, (multi_process_jax.OVERFLOW, multi_process_jax.labels[:8]))
    split = reports[0]
    assert (one.born_in, one.born_at, one.born_type) == ("forward", "up", "Dense")
    same = ("born_in", "born_at", "born_type", "born_path", "born_inside", "born_input_range", "replayed")
    for field in same:
        assert split[field] == _json(getattr(one, field)), field
    # How many of the example's 64 outputs of `up` overflow depends on the order of its float32 sums,
    # which the split kernel (its 32 inputs over the devices) changes: some do, all of them Inf.
    assert 0 < split["born_inf_count"] <= 64 and 0 < one.born_inf_count <= 64
    assert split["born_nan_count"] == one.born_nan_count == 0


@pytest.fixture(scope="module")
def own_step_after_step_0():
    """`after_step_0` for the model with its own ``train_step`` (`GuideModel`, `kgrad.value_and_grad`)."""
    model = multi_process_jax.build(None, own_step=True)
    model.fit(multi_process_jax.features[:8], multi_process_jax.labels[:8], batch_size=8, verbose=0)
    return model


def test_an_own_train_steps_trip_is_replayed_by_both_processes_as_one_process_replays_it(
        run, own_step_after_step_0):
    """A model's own ``train_step``: its replay runs eagerly, part by part, on both processes together."""
    out, _, _ = run
    reports = [records(out / f"guard_{process}.json")["own_step"] for process in (0, 1)]
    assert reports[0] == reports[1]
    split = reports[0]
    assert split["iterations"] == 1 and split["step"] == 1
    # The NaN in the data of process 1's half, found before the pass as one process finds it.
    bad = multi_process_jax.features.copy()
    bad[multi_process_jax.NAN_AT] = np.nan
    one = kgrad.replay_step(own_step_after_step_0, (bad[8:], multi_process_jax.labels[8:]), step=1)
    assert (one.born_in, one.born_at) == ("data", "input")
    for field in multi_process_jax.BORN:
        assert split[field] == _json(getattr(one, field)), field
    # The Inf born inside the part's pass, in `up`: the eager part-by-part replay over the mesh.
    one = kgrad.replay_step(own_step_after_step_0, (multi_process_jax.OVERFLOW, multi_process_jax.labels[:8]))
    replayed = split["replay_step"]
    assert (one.born_in, one.born_type) == ("forward", "Dense") and one.born_at.endswith("/up")
    for field in ("born_in", "born_at", "born_type", "born_path", "born_inside", "born_input_range",
                  "replayed", "replay_note"):
        assert replayed[field] == _json(getattr(one, field)), field
    # As for Keras' step: how many of `up`'s outputs overflow depends on the order of the float32 sums.
    assert 0 < replayed["born_inf_count"] <= 64 and replayed["born_nan_count"] == one.born_nan_count == 0
