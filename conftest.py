"""Which backend's code a test run collects: Keras picks one backend per process.

``python -m pytest`` collects the tests and the docstring examples of kgrad
(``testpaths`` in setup.cfg); the examples under ``kgrad/backends/<name>/``
are collected only in a run on that backend, and the tests of another backend
(``tests/jax``) are shown as skipped with the command that runs them.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The trackers' tests and examples (kgrad.WandbSink, kgrad.MlflowSink) never reach a network:
# W&B offline, in a folder of its own, MLflow on a local store, neither sending telemetry.
for _name, _value in {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_ERROR_REPORTING": "false",
    "WANDB_DISABLE_GIT": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ALLOW_FILE_STORE": "true",
}.items():
    os.environ.setdefault(_name, _value)
if "WANDB_DIR" not in os.environ:
    import tempfile

    os.environ["WANDB_DIR"] = tempfile.mkdtemp(prefix="kgrad-wandb-")

import keras  # noqa: E402
import pytest  # noqa: E402

_BACKEND_FOLDERS = {"tensorflow": "kgrad/backends/tensorflow", "jax": "kgrad/backends/jax"}
# The backend the run was started with: tests that start subprocesses pass the
# environment on, so a module that sets KERAS_BACKEND while it is collected
# (an example imported by a test) would run them on another backend.
_STARTED_WITH = os.environ.get("KERAS_BACKEND")


def pytest_configure(config):
    # Opt-in: each test's CPU seconds, written to the file the variable names (tests/cpu_times.py).
    if os.environ.get("KGRAD_TEST_CPU_TIMES"):
        import sys

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
        import cpu_times

        cpu_times.pytest_configure(config)


def pytest_collection_finish(session):
    if os.environ.get("KERAS_BACKEND") != _STARTED_WITH:
        changed_to = os.environ.get("KERAS_BACKEND")
        raise pytest.UsageError(
            f"a module imported while collecting the tests set KERAS_BACKEND={changed_to!r} (the run "
            f"started with {_STARTED_WITH!r}); subprocesses of this run would use it. Set it only "
            "under `if __name__ == '__main__':`."
        )


def pytest_ignore_collect(collection_path, config):
    path = str(collection_path).replace("\\", "/")
    backend = keras.config.backend()
    return any(folder in path and name != backend for name, folder in _BACKEND_FOLDERS.items()) or None


def pytest_collection_modifyitems(config, items):
    if keras.config.backend() == "jax":
        return
    skip = pytest.mark.skip(reason="JAX backend tests: run `KERAS_BACKEND=jax python -m pytest tests/jax`")
    for item in items:
        if "tests/jax/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
