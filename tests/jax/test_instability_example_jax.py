"""examples/instability.py on JAX: the same planted blow-up, flagged before the loss spikes, checked as on
TensorFlow (tests/test_instability_example.py: the spike rule recomputed in NumPy from the event files)."""

import os
import subprocess
import sys

import pytest

import kgrad
import test_instability_example as on_tensorflow  # tests/ is on the path (tests/jax/conftest.py)

pytest.importorskip("keras_hub")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("instability_jax") / "logs"
    environment = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, str(on_tensorflow.SCRIPT), str(log_dir)], capture_output=True,
                            text=True, timeout=600, env=environment, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, log_dir


@pytest.fixture(scope="module")
def run(finished):
    result, log_dir = finished
    return result.stdout, kgrad.read_logs(log_dir)


def test_no_tensorflow_start_up_lines_on_jax(finished):
    # KerasHub imports TensorFlow, whose C++ start-up lines ignore TF_CPP_MIN_LOG_LEVEL.
    result, _ = finished
    assert "absl::InitializeLog" not in result.stderr and "port.cc" not in result.stderr, result.stderr


def test_a_layer_is_flagged_before_the_loss_spikes_on_jax(run):
    on_tensorflow.test_a_layer_is_flagged_before_the_loss_spikes(run)


def test_the_key_biases_are_rounding_noise_and_never_named_on_jax(run):
    on_tensorflow.test_the_key_biases_are_rounding_noise_and_never_named(run)
