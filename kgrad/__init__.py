"""kgrad: see what the gradients are doing inside a Keras model while it trains."""

from kgrad.callbacks.gradient_probe import GradientProbe
from kgrad.config import CAPTURE_KINDS
from kgrad.losses import prediction_gradient
from kgrad.model import ProbingModel
from kgrad.state import ProbeRecord
from kgrad.taps import tap
from kgrad.tape import ProbeResult
from kgrad.tape import ProbeTape

__version__ = "0.1.0"

__all__ = [
    "CAPTURE_KINDS",
    "GradientProbe",
    "ProbeRecord",
    "ProbeResult",
    "ProbeTape",
    "ProbingModel",
    "prediction_gradient",
    "tap",
]
