"""What reads logs runs without TensorFlow: the command line, the report, `read_logs` and the kgrad tab.

Each check runs in a subprocess whose import system refuses TensorFlow, Keras
and JAX (a meta-path finder installed by ``sitecustomize``), on logs written
by a real ``fit`` in this process, and compares what it gets with what this
process (TensorFlow imported) gets from the same logs.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import kgrad

BLOCKER = '''
import sys

class BlockBackends:
    """Refuses every module of TensorFlow, Keras and JAX, as if none were installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras", "jax", "tf_keras"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, BlockBackends())
'''


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    """A probed and guarded fit whose step 3 trips the guard."""
    log_dir = str(tmp_path_factory.mktemp("logs") / "runs")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, activation="relu", name="hidden"),
         keras.layers.Dense(1, name="out")], name="m",
    )
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    x[13, 0] = np.nan
    run = os.path.join(log_dir, "run1")
    model.fit(x, np.ones((32, 1)), batch_size=4, shuffle=False, verbose=0, callbacks=[
        kgrad.GradientProbe(run, every_n_steps=1), kgrad.NonFiniteGuard(log_dir=run)])
    return log_dir


def run_blocked(tmp_path, code, *args):
    """Runs ``code`` in a Python whose imports of TensorFlow, Keras and JAX fail; returns the process."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


CLI = "import sys; from kgrad.cli import main; sys.exit(main(sys.argv[1:]))"
NO_BACKEND_LOADED = (
    "import sys; loaded = sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras', 'jax'}); "
    "assert not loaded, loaded"
)


def test_the_blocker_blocks(tmp_path):
    process = run_blocked(tmp_path, "import tensorflow")
    assert process.returncode == 1 and "blocked by the test" in process.stderr


def test_kgrad_help_and_version(tmp_path):
    process = run_blocked(tmp_path, CLI, "--help")
    assert process.returncode == 0, process.stderr
    assert "report" in process.stdout and "demo" in process.stdout


def test_kgrad_report_and_its_html(tmp_path, log_dir, capsys):
    html = tmp_path / "report.html"
    process = run_blocked(tmp_path, f"{CLI.replace('sys.exit(', 'code = (')}\n{NO_BACKEND_LOADED}\n"
                          "sys.exit(code)", "report", log_dir, "--html", str(html))
    assert process.returncode in (0, 1), process.stderr  # 1: a layer flagged (the NaN)
    from kgrad.cli import main

    code = main(["report", log_dir])
    assert process.stdout.splitlines()[:-1] == capsys.readouterr().out.splitlines()
    assert process.returncode == code
    assert "<html" in html.read_text().lower() and "hidden" in html.read_text()


def test_a_usage_error_loads_no_backend(tmp_path):
    process = run_blocked(tmp_path, f"import sys\ntry:\n    {CLI}\nfinally:\n    {NO_BACKEND_LOADED}",
                          "report", str(tmp_path / "nonexistent"))
    assert process.returncode == 2
    assert "`log_dir` does not exist" in process.stderr and "Traceback" not in process.stderr


def test_read_logs_gives_the_same_values(tmp_path, log_dir):
    code = f"""
        import json, sys, kgrad
        logs = kgrad.read_logs({log_dir!r})
        print(json.dumps({{run: {{tag: [s.steps.tolist(), s.values.tolist()]
                                  for tag, s in data["scalars"].items()}} for run, data in logs.items()}}))
        {NO_BACKEND_LOADED}
    """
    process = run_blocked(tmp_path, code)
    assert process.returncode == 0, process.stderr
    blocked = json.loads(process.stdout)
    here = kgrad.read_logs(log_dir)
    assert set(blocked) == set(here) == {"run1/kgrad"}
    for run, data in here.items():
        assert set(blocked[run]) == set(data["scalars"])
        for tag, series in data["scalars"].items():
            np.testing.assert_array_equal(blocked[run][tag][0], series.steps)
            np.testing.assert_array_equal(np.array(blocked[run][tag][1], float), series.values)


def test_the_tensorboard_plugin_loads_and_serves_its_routes(tmp_path, log_dir):
    code = f"""
        import json, sys
        from tensorboard.plugins import base_plugin
        from werkzeug.test import Client
        from kgrad.dashboard.plugin import KgradPluginLoader

        plugin = KgradPluginLoader().load(base_plugin.TBContext(logdir={log_dir!r}))
        apps = plugin.get_plugin_apps()
        def get(route, query=""):
            response = Client(apps[route]).get(route + query)
            assert response.status_code == 200, (route, response.status_code, response.get_data(as_text=True))
            return response
        runs = json.loads(get("/runs").get_data(as_text=True))
        heatmap = json.loads(get("/heatmap", "?run=run1/kgrad&quantity=weight_grad").get_data(as_text=True))
        summary = json.loads(get("/summary", "?run=run1/kgrad").get_data(as_text=True))
        script = get("/index.js").get_data(as_text=True)
        print(json.dumps({{"runs": runs, "layers": heatmap.get("layers"), "summary": sorted(summary),
                           "script": len(script)}}))
        {NO_BACKEND_LOADED}
    """
    process = run_blocked(tmp_path, code)
    assert process.returncode == 0, process.stderr
    served = json.loads(process.stdout)
    assert "run1" in json.dumps(served["runs"])
    assert served["layers"] == ["hidden", "out"]
    assert served["script"] > 0 and served["summary"]


def test_the_sinks_and_the_html_report_they_attach_run_without_a_backend(tmp_path, log_dir):
    code = f"""
        import json, sys
        import numpy as np
        from kgrad.logs.record import ProbeRecord
        from kgrad.sinks.base import Sink
        from kgrad.sinks.fanout import SinkSet
        from kgrad.sinks.json_lines import JsonLinesSink

        class Pages(Sink):
            def attach_html_report(self, html, step, label):
                self.page = (step, label, html)

        pages = Pages()
        sinks = SinkSet((JsonLinesSink("out.jsonl"), pages), "GradientProbe")
        sinks.open()
        histogram = np.array([[0.0, 1.0, 4.0]])
        sinks.write(ProbeRecord(3, {{"grad_norm/hidden": 0.5}}, {{"grad_hist/hidden": histogram}}))
        sinks.close(attach_report=True, log_dir=sys.argv[1], step=3)
        step, label, html = pages.page
        print(json.dumps([open("out.jsonl").read(), step, label, html.startswith("<!DOCTYPE html>")]))
        {NO_BACKEND_LOADED}
    """
    process = run_blocked(tmp_path, code, os.path.join(log_dir, "run1"))
    assert process.returncode == 0, process.stderr
    line, step, label, is_page = json.loads(process.stdout)
    assert json.loads(line) == {"record": "probe", "step": 3, "tape": None, "grad_norm/hidden": 0.5,
                                "histograms": {"grad_hist/hidden": {"edges": [0.0, 1.0], "counts": [4]}}}
    assert (step, label, is_page) == (3, "end_of_fit", True)
