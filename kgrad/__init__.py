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
    "NonFiniteError",
    "NonFiniteGuard",
    "NonFiniteReport",
    "NoiseScaleSmoother",
    "ProbeRecord",
    "ProbeResult",
    "ProbeTape",
    "ProbingModel",
    "first_non_finite",
    "health_report",
    "prediction_gradient",
    "read_logs",
    "replay_step",
    "tap",
    "write_html_report",
]

# Each public name and the module that defines it: a name added to __all__
# is added here too (tests/test_public_api.py checks both lists agree).
_MODULES = {
    "CAPTURE_KINDS": "kgrad.config",
    "GUARD_KINDS": "kgrad.config",
    "GradientProbe": "kgrad.callbacks.gradient_probe",
    "HealthThresholds": "kgrad.report",
    "NonFiniteError": "kgrad.guard",
    "NonFiniteGuard": "kgrad.callbacks.non_finite_guard",
    "NonFiniteReport": "kgrad.guard",
    "NoiseScaleSmoother": "kgrad.instruments.noise_scale",
    "ProbeRecord": "kgrad.state",
    "ProbeResult": "kgrad.probe_result",
    "ProbeTape": "kgrad.tape",
    "ProbingModel": "kgrad.model",
    "first_non_finite": "kgrad.guard",
    "health_report": "kgrad.report",
    "prediction_gradient": "kgrad.losses",
    "read_logs": "kgrad.reading",
    "replay_step": "kgrad.replay",
    "tap": "kgrad.taps",
    "write_html_report": "kgrad.html_report",
}

if typing.TYPE_CHECKING:  # what static tools and IDEs see
    from kgrad.callbacks.gradient_probe import GradientProbe  # noqa: F401
    from kgrad.callbacks.non_finite_guard import NonFiniteGuard  # noqa: F401
    from kgrad.config import CAPTURE_KINDS, GUARD_KINDS  # noqa: F401
    from kgrad.guard import NonFiniteError, NonFiniteReport, first_non_finite  # noqa: F401
    from kgrad.html_report import write_html_report  # noqa: F401
    from kgrad.instruments.noise_scale import NoiseScaleSmoother  # noqa: F401
    from kgrad.losses import prediction_gradient  # noqa: F401
    from kgrad.model import ProbingModel  # noqa: F401
    from kgrad.probe_result import ProbeResult  # noqa: F401
    from kgrad.reading import read_logs  # noqa: F401
    from kgrad.replay import replay_step  # noqa: F401
    from kgrad.report import HealthThresholds, health_report  # noqa: F401
    from kgrad.state import ProbeRecord  # noqa: F401
    from kgrad.tape import ProbeTape  # noqa: F401
    from kgrad.taps import tap  # noqa: F401


def __getattr__(name):
    """Loads a public name, or a submodule (``kgrad.stats``), on first use."""
    if name in _MODULES:
        value = getattr(importlib.import_module(_MODULES[name]), name)
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
