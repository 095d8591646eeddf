"""The public names whose meaning is TensorFlow's, on JAX: each says what it is and what to use instead.

`kgrad.ProbeTape` is a ``tf.GradientTape``; on JAX gradients come from
``jax.value_and_grad`` inside a pure ``train_step``, where a tape has no
meaning. The JAX counterpart of `kgrad.ProbeTape` in a model's own
``train_step`` is `kgrad.value_and_grad` (a drop-in for
``jax.value_and_grad``); with Keras' own ``train_step``, `kgrad.GradientProbe`
alone.
"""

from kgrad.backends import UnsupportedBackendError

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
ProbingModel = _unavailable("ProbingModel", "overrides the TensorFlow train_step")
ProbeResult = _unavailable("ProbeResult", "is what a ProbeTape returns")
first_non_finite = _unavailable("first_non_finite", "reads a ProbeTape's result")
replay_step = _unavailable("replay_step", "replays a NonFiniteGuard's step, which runs on TensorFlow only")
