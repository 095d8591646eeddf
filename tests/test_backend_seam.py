"""The backend seam: `kgrad.backends.current()` and what every backend module provides."""

import inspect
import os
import subprocess
import sys
import textwrap

import pytest

import kgrad
from kgrad import backends
from kgrad.backends import interface
from kgrad.backends.common import public_functions


def test_the_tensorflow_backend_provides_every_name_of_the_interface():
    backend = backends.current()
    assert backend.NAME == "tensorflow"
    missing = [name for name in interface.BACKEND_NAMES if not hasattr(backend, name)]
    assert not missing
    protocol_names = {
        name for name in vars(interface.Backend) if not name.startswith("_")
    } | set(interface.Backend.__annotations__)
    assert protocol_names == set(interface.BACKEND_NAMES)


def test_public_names_of_the_backend_are_the_backends_own():
    backend = backends.current()
    for name in ("ProbeTape", "ProbingModel", "ProbeResult", "first_non_finite", "replay_step"):
        assert getattr(kgrad, name) is getattr(backend, name)


def test_tap_and_prediction_gradient_are_documented_once_and_call_the_backends_own(monkeypatch):
    # One function and one docstring on every backend (help(kgrad.tap)); the work is the backend's,
    # whose own docstring says what it does there.
    backend = backends.current()
    for name in ("tap", "prediction_gradient"):
        assert getattr(kgrad, name) is getattr(public_functions, name)
        assert inspect.getdoc(getattr(backend, name)).lower().startswith(f"`kgrad.{name}` on {backend.NAME}")
    calls = []
    monkeypatch.setattr(backend, "tap", lambda name, x: calls.append(("tap", name, x)) or x)
    monkeypatch.setattr(backend, "prediction_gradient", lambda *arguments: calls.append(arguments) or "dJ/dŷ")
    assert kgrad.tap("hidden", 3.0) == 3.0
    assert kgrad.prediction_gradient("mse", 1.0, 2.0) == "dJ/dŷ"
    assert calls == [("tap", "hidden", 3.0), ("mse", 1.0, 2.0, None)]
    with pytest.raises(TypeError, match="`name` must be a non-empty string"):
        kgrad.tap("", 3.0)  # checked once, for every backend


@pytest.mark.parametrize("use", [
    "kgrad.GradientProbe(log_dir)",
    "kgrad.NonFiniteGuard(log_dir=log_dir)",
    "kgrad.ProbeTape",
])
def test_an_unsupported_backend_is_named_before_training_and_leaves_no_folder(tmp_path, use):
    # Keras' NumPy backend needs nothing more installed; kgrad does not run on it.
    log_dir = tmp_path / "logs"
    code = f"""
        import kgrad
        log_dir = {str(log_dir)!r}
        try:
            {use}
        except kgrad.backends.UnsupportedBackendError as error:
            print(error)
        else:
            raise SystemExit("no error")
    """
    process = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "KERAS_BACKEND": "numpy"},
    )
    assert process.returncode == 0, process.stderr
    assert "kgrad does not support Keras' 'numpy' backend yet" in process.stdout
    assert "supported: tensorflow, jax" in process.stdout and "KERAS_BACKEND=tensorflow" in process.stdout
    assert not log_dir.exists()
