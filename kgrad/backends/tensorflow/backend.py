"""kgrad on Keras' TensorFlow backend: the names `kgrad.backends.interface.Backend` lists.

The stages of a traced step live beside this module: ``capture/`` (taps on
layer and op outputs, `ProbeTape`), ``differentiate/`` (the probing
``train_step``, one backward pass), ``summarize/`` (statistics on device),
``handover/`` (the device buffer the host reads after probed steps) and
``guard/`` (the sentinel, the kept batch and the replay).
"""

from kgrad.backends import UnsupportedBackendError
from kgrad.backends.common.replay_step import replay_step  # noqa: F401
from kgrad.backends.tensorflow.capture.probe_result import ProbeResult  # noqa: F401
from kgrad.backends.tensorflow.capture.tape import ProbeTape  # noqa: F401
from kgrad.backends.tensorflow.capture.taps import tap  # noqa: F401
from kgrad.backends.tensorflow.differentiate.install import (  # noqa: F401
    attach,
    detach,
    unprobed_train_function,
)
from kgrad.backends.tensorflow.differentiate.losses import prediction_gradient  # noqa: F401
from kgrad.backends.tensorflow.differentiate.model import ProbingModel  # noqa: F401
from kgrad.backends.tensorflow.guard.first_non_finite import first_non_finite  # noqa: F401
from kgrad.backends.tensorflow.guard.replay import replay_fields  # noqa: F401
from kgrad.backends.tensorflow.handover import replicas
from kgrad.plan import selection

NAME = "tensorflow"


def check_supported(role):
    """Both roles, ``"probe"`` and ``"guard"``, run on TensorFlow."""
    del role


def check_dump(dump_dir):
    """A trip's dump is written on TensorFlow: every worker holds the whole model and its batch."""
    del dump_dir


def value_and_grad(fn, argnums=0, has_aux=False, name=None):
    """Not on TensorFlow: `kgrad.value_and_grad` is the JAX counterpart of `kgrad.ProbeTape`.

    Raises:
        UnsupportedBackendError: Always, naming `kgrad.ProbeTape`.

    Example:

    >>> import kgrad
    >>> try:
    ...     kgrad.value_and_grad(lambda w: w * w)
    ... except kgrad.UnsupportedBackendError as error:
    ...     print(str(error).split(":")[0])
    kgrad.value_and_grad wraps jax.value_and_grad in a JAX train_step
    """
    del fn, argnums, has_aux, name
    raise UnsupportedBackendError(
        "kgrad.value_and_grad wraps jax.value_and_grad in a JAX train_step: Keras runs on "
        "TensorFlow here. In a TensorFlow train_step, replace `tf.GradientTape()` with "
        "`kgrad.ProbeTape(model)` (or `kgrad.ProbeTape(self.generator, name=...)`), the TensorFlow "
        "counterpart; or set KERAS_BACKEND=jax to use kgrad.value_and_grad."
    )


def check_layers(model, layers):
    """Raises a ValueError naming a layer ``model`` does not have (`kgrad.plan.selection`)."""
    selection.resolve_layers(model, layers)


def is_chief(model):
    """Under a multi-worker strategy every worker probes (its collectives need all), the chief writes."""
    return replicas.is_chief(model.distribute_strategy)
