"""On JAX: no TensorFlow anywhere on the path, the demo and the report, and what does not run there yet."""

import os
import subprocess
import sys
import textwrap

import pytest

import kgrad

BLOCK_TENSORFLOW = """
import sys

class BlockTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, BlockTensorFlow())
"""


def test_a_probed_jax_fit_writes_logs_with_tensorflow_blocked(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCK_TENSORFLOW)
    code = f"""
        import keras, numpy as np, sys, kgrad
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu", name="hidden"),
                                  keras.layers.Dense(1, name="out")])
        model.compile("adam", "mse")
        model.fit(np.ones((16, 3), "float32"), np.ones((16, 1), "float32"), batch_size=4, verbose=0,
                  callbacks=[kgrad.GradientProbe({str(tmp_path / "logs")!r}, every_n_steps=2)])
        logs = kgrad.read_logs({str(tmp_path / "logs")!r})
        print(logs["kgrad"]["scalars"]["weight_grad_norm/hidden/kernel"].steps.tolist())
        assert not [name for name in sys.modules if name.split(".")[0] == "tensorflow"]
    """
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    process = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    assert process.stdout.strip().splitlines()[-1] == "[0, 2]"


def test_the_demo_on_jax_finds_the_vanishing_layers(tmp_path):
    import io

    from kgrad import demo

    out = io.StringIO()
    demo.run_demo(str(tmp_path / "demo"), epochs=2, overwrite=True, out=out)
    (sigmoid, relu) = sorted(
        kgrad.health_report(kgrad.read_logs(str(tmp_path / "demo"))), key=lambda run: run.run, reverse=True
    )
    assert sigmoid.run == "sigmoid_deep/kgrad" and relu.run == "relu_deep/kgrad"
    # The first layers vanish (how many depends on the draw of the initial weights: 3-4).
    vanishing = [layer.layer for layer in sigmoid.layers if "vanishing" in layer.flags]
    assert len(vanishing) >= 3 and vanishing == [f"hidden_{i}" for i in range(1, len(vanishing) + 1)]
    assert not any(layer.flags for layer in relu.layers)


@pytest.mark.parametrize("name", ["ProbeTape"])
def test_tensorflow_only_names_say_what_to_use_on_jax(name):
    with pytest.raises(kgrad.backends.UnsupportedBackendError, match=rf"kgrad.{name} .*GradientProbe"):
        getattr(kgrad, name)(None)
