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
# One JAX compilation cache for the whole run, shared by the xdist workers and the subprocesses
# the tests start (they inherit this environment). The tests compile the same XLA programs again
# and again (a model fitted with and without a probe, the demo's models in several tests), and
# XLA's CPU compiler is a large part of a JAX test's time: a hit returns the same executable, so no
# value changes. Every program is cached, however small or quick to compile. The scripts that read
# what compiling says (tests/scripts/model_parallel_hlo_jax.py: XLA's warnings) turn it off.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache = tempfile.mkdtemp(prefix="kgrad-xla-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

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


#: The modules that took the most CPU seconds (docs/development.md's ranking), run first:
#: `--dist loadscope` hands whole modules to the two workers in this order, so a long module
#: started last cannot leave the other worker idle at the end (the small ones fill the gaps).
LONGEST_MODULES_FIRST = {
    # CPU-s (the test process's and its subprocesses') measured with tests/cpu_times.py: TensorFlow
    # in CI's run of 7f35b34 (`-n 3`), JAX in a `-n 2` run of the half at 7f35b34, idle machine.
    "tensorflow": (
        "tests/test_docs.py",  # 69
        "tests/test_distribute.py",  # 63
        "tests/test_benchmarks_quick.py",  # 53
        "tests/test_long_run.py",  # 46
        "tests/test_attention_instrument.py",  # 39
        "tests/test_non_finite_guard.py",  # 32
        "tests/test_per_example.py",  # 30
        "tests/test_backends_agree.py",  # 28
        "tests/test_custom_train_step_guard.py",  # 26
        "tests/test_training_unchanged.py",  # 25
        "tests/test_structure.py",  # 25
        "tests/test_spike_skipping.py",  # 25
        "tests/test_replay_steps_per_execution.py",  # 24
        "tests/test_stats.py",  # 23
        "tests/test_replay.py",  # 23
        "tests/test_stability_instruments.py",  # 22
        "tests/test_gradient_probe.py",  # 19
        "tests/test_custom_train_step.py",  # 19
    ),
    "jax": (
        "tests/jax/test_instruments_jax.py",  # 127
        "tests/jax/test_guard_own_step_jax.py",  # 96
        "tests/jax/test_own_step_jax.py",  # 75
        "tests/jax/test_own_step_loss_scale_jax.py",  # 70
        "tests/jax/test_spike_skipping_jax.py",  # 63
        "tests/jax/test_model_parallel_values_jax.py",  # 62
        "tests/jax/test_spike_skipping_own_step_jax.py",  # 60
        "tests/jax/test_guard_jax.py",  # 59
        "tests/jax/test_data_parallel_jax.py",  # 58
        "tests/jax/test_multi_process_jax.py",  # 42, and ~20 s of waiting for a killed process
        "tests/jax/test_own_step_instruments_jax.py",  # 50
        "tests/jax/test_gradient_probe_jax.py",  # 46
        "tests/jax/test_sharded_lora_example_jax.py",  # 40
        "tests/jax/test_probing_model_jax.py",  # 31
        "tests/jax/test_rounding_noise_attention_jax.py",  # 29
        "tests/jax/test_model_parallel_hlo_jax.py",  # 28
        "tests/jax/test_guard_watch_jax.py",  # 27
        "tests/jax/test_loss_scale_jax.py",  # 26
    ),
}


def longest_first(items, backend):
    """``items`` with the modules of ``LONGEST_MODULES_FIRST[backend]`` first, in that order.

    The others keep their order after them, and each module's tests stay together in theirs.
    """
    rank = {module: index for index, module in enumerate(LONGEST_MODULES_FIRST.get(backend, ()))}

    def module_rank(item):
        return rank.get(item.nodeid.split("::")[0], len(rank))

    return sorted(items, key=module_rank)  # stable


def pytest_collection_modifyitems(config, items):
    items[:] = longest_first(items, keras.config.backend())
    if keras.config.backend() == "jax":
        return
    skip = pytest.mark.skip(reason="JAX backend tests: run `KERAS_BACKEND=jax python -m pytest tests/jax`")
    for item in items:
        if "tests/jax/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
