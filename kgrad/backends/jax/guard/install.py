"""Attaching `kgrad.NonFiniteGuard` to a JAX ``fit``: its train function, alone or inside the probe's.

With the guard alone, every execution runs `GuardTrainFunction` (each step
Keras' own, guarded). With a `kgrad.GradientProbe` too, the probe's train
function runs its steps through the same `GuardRun` (probed steps with the
sentinel inside their one backward pass), and executions without a probed
step run the guard's function: both share one record, so the trip flag and
the last finite step are one. Whichever callback attaches first, the other
joins it. The `GuardRun` is kept on the model after ``fit``: a later ``fit``
with the same options does not compile its step again.
"""

from kgrad.backends import UnsupportedBackendError
from kgrad.backends.common.own_step import check_stateless_train_step, has_own_train_step
from kgrad.backends.jax.guard.own_step import OwnStepGuardRun
from kgrad.backends.jax.guard.run import GuardRun

_GUARD = "_kgrad_jax_guard"
_KEPT = "_kgrad_jax_guard_runs"


def keras_train_function(model):
    """Keras' own train function of ``model``, also while a kgrad function stands in for it."""
    function = model.train_function
    return getattr(function, "keras_train_function", function)


def attached_guard(model):
    """The `GuardRun` attached to ``model`` for this ``fit``, or ``None``."""
    return model.__dict__.get(_GUARD)


def attach_guard(model, config, probing_function=None):
    """Installs the guard for this ``fit``; ``probing_function``: the probe's, if one is installed."""
    check_guard(model, config)
    if has_own_train_step(model):
        check_stateless_train_step(model, "NonFiniteGuard")
    keras_function = keras_train_function(model)
    kept = model.__dict__.setdefault(_KEPT, [])
    same = [run for run in kept if run.config == config and run.keras_train_function is keras_function]
    # A model with its own train_step is guarded through its kgrad.value_and_grad calls.
    kind = OwnStepGuardRun if has_own_train_step(model) else GuardRun
    run = same[0] if same else kind(model, config, keras_function)
    if not same:
        kept[:] = [r for r in kept if r.keras_train_function is keras_function][-3:] + [run]
    run.reset(everything=True)
    object.__setattr__(model, _GUARD, run)
    if probing_function is not None:
        probing_function.guard = run
    else:
        model.train_function = run.train_function
    return run


def detach_guard(model, probing_function=None):
    """Takes the guard out: the probe's function runs unguarded, or Keras' own comes back."""
    run = model.__dict__.pop(_GUARD, None)
    if probing_function is not None:
        probing_function.guard = None
    if run is not None and model.train_function is run.train_function:
        model.train_function = run.keras_train_function if probing_function is None else probing_function


def check_guard(model, config):
    """Raises, before anything is installed, for what the guard does not do on JAX yet."""
    if model.optimizer is None:
        raise ValueError("NonFiniteGuard needs a compiled model: call model.compile(...) before fit.")
    unsupported = None
    if callable(getattr(model, "configure_probe", None)):  # a kgrad.ProbingModel
        unsupported = (
            f"model '{model.name}' is a kgrad.ProbingModel, which keeps only its latest probed record; "
            "after a trip the steps Keras' loop runs before it stops apply nothing and their records "
            "would replace it. Guard a plain keras.Model and pass kgrad.GradientProbe(...) to fit instead"
        )
    if unsupported is not None:
        raise UnsupportedBackendError(
            f"kgrad.NonFiniteGuard cannot guard this fit on Keras' JAX backend: {unsupported}. "
            "Set KERAS_BACKEND=tensorflow, where it is supported."
        )

