"""kgrad on Keras' JAX backend: the names `kgrad.backends.interface.Backend` lists.

The stages of the traced step live beside this module: ``capture/`` (taps on
layer and op outputs, carriers whose cotangent is dJ/d(output)'s statistics),
``differentiate/`` (Keras' step with them, one backward pass; the train
function of probed executions), ``summarize/`` (moments and histograms in
``jax.numpy``) and ``handover/`` (device records read after probed steps).
``own_step/`` probes a model's own ``train_step`` through `kgrad.value_and_grad`.
``guard/`` runs `kgrad.NonFiniteGuard`: the sentinel, its train function, the replay.
The TensorFlow-only names say so when used.
"""

import jax

from kgrad.backends.jax.differentiate.install import (  # noqa: F401
    attach,
    check_supported,
    detach,
    unprobed_train_function,
)
from kgrad.backends.jax.guard.replay import replay_fields, replay_step  # noqa: F401
from kgrad.backends.jax.unavailable import (  # noqa: F401
    ProbeResult,
    ProbeTape,
    first_non_finite,
)
from kgrad.backends.jax.capture.user_taps import tap  # noqa: F401
from kgrad.backends.jax.differentiate.model import ProbingModel  # noqa: F401
from kgrad.backends.jax.differentiate.prediction_gradient import prediction_gradient  # noqa: F401
from kgrad.backends.jax.own_step.value_and_grad import value_and_grad  # noqa: F401
from kgrad.plan import selection

NAME = "jax"


def check_layers(model, layers):
    """Raises a ValueError naming a layer ``model`` does not have (`kgrad.plan.selection`)."""
    selection.resolve_layers(model, layers)


def is_chief(model):
    """In a multi-process JAX run, process 0 writes the logs."""
    del model
    return jax.process_index() == 0

