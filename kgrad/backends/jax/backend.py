"""kgrad on Keras' JAX backend: the names `kgrad.backends.interface.Backend` lists.

The stages of the traced step live beside this module (docs/architecture.md
draws them). The TensorFlow-only names say so when used: `kgrad.ProbeTape` is a
``tf.GradientTape``; on JAX gradients come from ``jax.value_and_grad`` inside
a pure ``train_step``, where a tape has no meaning. The JAX counterpart of
`kgrad.ProbeTape` in a model's own ``train_step`` is `kgrad.value_and_grad`
(a drop-in for ``jax.value_and_grad``); with Keras' own ``train_step``,
`kgrad.GradientProbe` alone.
"""

import jax

from kgrad.backends import UnsupportedBackendError
from kgrad.backends.common.replay_step import replay_step  # noqa: F401
from kgrad.backends.jax.capture.taps import tap  # noqa: F401
from kgrad.backends.jax.differentiate.install import (  # noqa: F401
    attach,
    check_supported,
    detach,
    unprobed_train_function,
)
from kgrad.backends.jax.differentiate.model import ProbingModel  # noqa: F401
from kgrad.backends.jax.differentiate.prediction_gradient import prediction_gradient  # noqa: F401
from kgrad.backends.jax.guard.replay import replay_fields  # noqa: F401
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


def check_dump(dump_dir):
    """Refuses ``NonFiniteGuard(dump_dir=...)`` with several JAX processes, before fit starts.

    The dump is the whole model and batch, for a replay in one process; each process holds only its
    part of them, and gathering them is what a sharded model cannot afford. With one process it
    returns and the dump is written (`kgrad.backends.common.batch_dump`).
    """
    if jax.process_count() > 1:
        raise ValueError(
            f"NonFiniteGuard(dump_dir={dump_dir!r}) cannot dump a trip with {jax.process_count()} JAX "
            "processes: the dump is the whole model (step_<step>.keras) and batch, to replay in one process, "
            "and each process holds only its part of them (gathering them is what a sharded model cannot "
            "afford). The guard's replay runs on every process together, and process 0's report names "
            "where the NaN/Inf was born: leave dump_dir out (dump_dir=None)."
        )


_JAX_COUNTERPART = (
    "On JAX, pass kgrad.GradientProbe(...) to model.fit: with Keras' own train_step it needs "
    "nothing else; in a train_step of your own, replace `jax.value_and_grad(...)` with "
    "`kgrad.value_and_grad(...)` (the JAX counterpart). Or set KERAS_BACKEND=tensorflow to use "
)


def _unavailable(name, what):
    def refuse(*args, **kwargs):
        raise UnsupportedBackendError(
            f"kgrad.{name} {what}, so it does not run on Keras' JAX backend. {_JAX_COUNTERPART}"
            f"kgrad.{name}."
        )

    refuse.__name__ = name
    refuse.__doc__ = (
        f"Not on JAX: kgrad.{name} {what}. Raises `UnsupportedBackendError` when called; "
        "the JAX counterpart is `kgrad.value_and_grad` in a model's own train_step."
    )
    return refuse


ProbeTape = _unavailable("ProbeTape", "is a tf.GradientTape (JAX differentiates with jax.value_and_grad)")
ProbeResult = _unavailable("ProbeResult", "is what a ProbeTape returns")


def first_non_finite(*args, **kwargs):
    """Not on JAX: kgrad.first_non_finite reads a ProbeTape's result. Raises `UnsupportedBackendError`.

    Where a NaN/Inf was born, on JAX: `kgrad.NonFiniteGuard` passed to ``fit``
    (its report), or `kgrad.replay_step` on a step's batch; in a model's own
    ``train_step``, with `kgrad.value_and_grad` in place of ``jax.value_and_grad``.
    """
    raise UnsupportedBackendError(
        "kgrad.first_non_finite reads a ProbeTape's result, so it does not run on Keras' JAX backend. "
        "On JAX, pass kgrad.NonFiniteGuard() to model.fit (guard.report says where the first NaN/Inf "
        "was born), or call kgrad.replay_step(model, (x, y)) on the step's batch; in a train_step of "
        "your own, replace `jax.value_and_grad(...)` with `kgrad.value_and_grad(...)` (the JAX "
        "counterpart) and the guard checks each of its calls. Or set KERAS_BACKEND=tensorflow to use "
        "kgrad.first_non_finite."
    )
