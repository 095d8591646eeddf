"""Shared test setup: quiet TensorFlow, deterministic seeds, fresh preloaded processes."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def preloaded_python(tmp_path_factory):
    """Fresh Python processes, forked from one that imported Keras and kgrad (tests/forked_python.py).

    One per test process: the docs' blocks and the example scripts run in its forks
    without a ~6 CPU-s TensorFlow import each.
    """
    from forked_python import PreloadedPython

    python = PreloadedPython(tmp_path_factory.mktemp("preloaded") / "server.stderr", {"CUDA_VISIBLE_DEVICES": ""})
    yield python
    python.close()


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(0)
    yield
