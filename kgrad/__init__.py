"""kgrad: see what the gradients are doing inside a Keras model while it trains."""

from kgrad.callbacks.gradient_probe import GradientProbe
from kgrad.callbacks.non_finite_guard import NonFiniteGuard
from kgrad.config import CAPTURE_KINDS
from kgrad.config import GUARD_KINDS
from kgrad.guard import NonFiniteError
from kgrad.guard import NonFiniteReport
from kgrad.guard import first_non_finite
from kgrad.html_report import write_html_report
from kgrad.losses import prediction_gradient
from kgrad.model import ProbingModel
from kgrad.reading import read_logs
from kgrad.report import HealthThresholds
from kgrad.report import health_report
from kgrad.state import ProbeRecord
from kgrad.taps import tap
from kgrad.tape import ProbeResult
from kgrad.tape import ProbeTape

__version__ = "0.1.0"

__all__ = [
    "CAPTURE_KINDS",
    "GUARD_KINDS",
    "GradientProbe",
    "HealthThresholds",
    "NonFiniteError",
    "NonFiniteGuard",
    "NonFiniteReport",
    "ProbeRecord",
    "ProbeResult",
    "ProbeTape",
    "ProbingModel",
    "first_non_finite",
    "health_report",
    "prediction_gradient",
    "read_logs",
    "tap",
    "write_html_report",
]
