"""kgrad: see what the gradients are doing inside a Keras model while it trains.

The public names load on first use (PEP 562): ``import kgrad`` and the
``kgrad`` command's ``--help`` do not import TensorFlow (~3 s), while
``from kgrad import GradientProbe``, ``kgrad.GradientProbe`` and
``dir(kgrad)`` work as with eager imports.
"""

import importlib
import typing

__version__ = "0.1.0"

__all__ = [
    "CAPTURE_KINDS",
    "GUARD_KINDS",
    "GradientProbe",
    "HealthThresholds",
    "JsonLinesSink",
    "MlflowSink",
    "NonFiniteError",
    "NonFiniteGuard",
    "NonFiniteReport",
    "NoiseScaleSmoother",
    "ProbeRecord",
    "ProbeResult",
    "ProbeTape",
    "ProbingModel",
    "Sink",
    "UnsupportedBackendError",
    "WandbSink",
    "first_non_finite",
    "health_report",
    "prediction_gradient",
    "read_logs",
    "replay_step",
    "tap",
    "value_and_grad",
    "write_html_report",
]

# The names whose meaning is the backend's own come from the backend Keras runs
# on (`kgrad.backends.current()`), which names the supported ones otherwise.
_BACKEND = "<the backend Keras runs on>"

# Each public name and the module that defines it: a name added to __all__
# is added here too (tests/test_public_api.py checks both lists agree).
_MODULES = {
    "CAPTURE_KINDS": "kgrad.plan.options",
    "GUARD_KINDS": "kgrad.plan.options",
    "GradientProbe": "kgrad.callbacks.gradient_probe",
    "HealthThresholds": "kgrad.report.health",
    "JsonLinesSink": "kgrad.sinks.json_lines",
    "MlflowSink": "kgrad.sinks.mlflow_sink",
    "NonFiniteError": "kgrad.report.non_finite",
    "NonFiniteGuard": "kgrad.callbacks.non_finite_guard",
    "NonFiniteReport": "kgrad.report.non_finite",
    "NoiseScaleSmoother": "kgrad.report.noise_scale",
    "ProbeRecord": "kgrad.logs.record",
    "ProbeResult": _BACKEND,
    "ProbeTape": _BACKEND,
    "ProbingModel": _BACKEND,
    "Sink": "kgrad.sinks.base",
    "UnsupportedBackendError": "kgrad.backends",
    "WandbSink": "kgrad.sinks.wandb_sink",
    "first_non_finite": _BACKEND,
    "health_report": "kgrad.report.health",
    "prediction_gradient": "kgrad.backends.common.public_functions",
    "read_logs": "kgrad.logs.reading",
    "replay_step": _BACKEND,
    "tap": "kgrad.backends.common.public_functions",
    "value_and_grad": _BACKEND,
    "write_html_report": "kgrad.dashboard.html_report",
}

if typing.TYPE_CHECKING:  # what static tools and IDEs see
    from kgrad.callbacks.gradient_probe import GradientProbe  # noqa: F401
    from kgrad.callbacks.non_finite_guard import NonFiniteGuard  # noqa: F401
    from kgrad.plan.options import CAPTURE_KINDS, GUARD_KINDS  # noqa: F401
    from kgrad.backends.tensorflow.guard.first_non_finite import first_non_finite  # noqa: F401
    from kgrad.backends import UnsupportedBackendError  # noqa: F401
    from kgrad.report.non_finite import NonFiniteError, NonFiniteReport  # noqa: F401
    from kgrad.dashboard.html_report import write_html_report  # noqa: F401
    from kgrad.report.noise_scale import NoiseScaleSmoother  # noqa: F401
    from kgrad.backends.common.public_functions import prediction_gradient, tap  # noqa: F401
    from kgrad.backends.tensorflow.differentiate.model import ProbingModel  # noqa: F401
    from kgrad.backends.tensorflow.capture.probe_result import ProbeResult  # noqa: F401
    from kgrad.logs.reading import read_logs  # noqa: F401
    from kgrad.backends.common.replay_step import replay_step  # noqa: F401
    from kgrad.report.health import HealthThresholds, health_report  # noqa: F401
    from kgrad.logs.record import ProbeRecord  # noqa: F401
    from kgrad.sinks.base import Sink  # noqa: F401
    from kgrad.sinks.json_lines import JsonLinesSink  # noqa: F401
    from kgrad.sinks.mlflow_sink import MlflowSink  # noqa: F401
    from kgrad.sinks.wandb_sink import WandbSink  # noqa: F401
    from kgrad.backends.tensorflow.capture.tape import ProbeTape  # noqa: F401
    from kgrad.backends.jax.own_step.value_and_grad import value_and_grad  # noqa: F401


def __getattr__(name):
    """Loads a public name, or a submodule (``kgrad.report``), on first use."""
    if name in _MODULES:
        if _MODULES[name] == _BACKEND:
            module = importlib.import_module("kgrad.backends").current()
        else:
            module = importlib.import_module(_MODULES[name])
        value = getattr(module, name)
        globals()[name] = value  # later lookups do not come here
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise  # the submodule exists but an import inside it failed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
