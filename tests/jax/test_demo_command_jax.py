"""`KERAS_BACKEND=jax kgrad demo` as a user runs it: the demo's output, and nothing of TensorFlow's."""

import os
import subprocess
import sys


def test_the_demo_on_jax_prints_no_tensorflow_start_up_lines(tmp_path):
    # Keras' TensorBoard callback (the demo's train/ logs) imports TensorFlow on JAX too;
    # TensorFlow 2.21 writes its start-up lines from C++, whatever TF_CPP_MIN_LOG_LEVEL says.
    env = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(KERAS_BACKEND="jax", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-m", "kgrad.cli", "demo", "--epochs", "1", "--log-dir",
                             str(tmp_path / "demo")], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[2/2] relu_deep" in result.stdout and "Done in" in result.stdout
    assert result.stderr == ""
    assert sorted(os.listdir(tmp_path / "demo" / "relu_deep")) == ["kgrad", "train", "validation"]
