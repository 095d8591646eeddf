"""Installing kgrad's JAX train function for one ``fit``, in place of Keras'.

A `kgrad.GradientProbe` installs a `kgrad.backends.jax.handover.train_function.TrainFunction`
whose probed step is `kgrad.backends.jax.own_step.parts.ProbedStep`; a
`kgrad.NonFiniteGuard` alone, its `GuardRun`'s. With both, the probe's function
runs its steps through the same `GuardRun` and executions without a probed step
run the guard's: one record, so the trip flag and the last finite step are one.
Whichever callback attaches first, the other joins it. Both are kept on the
model after ``fit`` (`_kept`): a later ``fit`` with the same options does not
compile its step again.
"""

from kgrad.backends import UnsupportedBackendError
from kgrad.backends.common import attached
from kgrad.backends.common.own_step import check_stateless_train_step, has_own_train_step
from kgrad.backends.jax.guard.run import GuardRun
from kgrad.backends.jax.handover.train_function import TrainFunction
from kgrad.backends.jax.layout_keys import warn_of_keys_that_split_nothing
from kgrad.backends.jax.own_step.parts import ProbedStep

def keras_train_function(model):
    """Keras' own train function of ``model``, also while a kgrad function stands in for it."""
    function = model.train_function
    return getattr(function, "keras_train_function", function)


def attached_guard(model):
    """The `GuardRun` attached to ``model`` for this ``fit``, or ``None``."""
    return attached.get(model, "installed_guard")


def attach_guard(model, config, probing_function=None):
    """Installs the guard for this ``fit``; ``probing_function``: the probe's, if one is installed."""
    check_guard(model)
    if has_own_train_step(model):
        check_stateless_train_step(model, "NonFiniteGuard")
    run = _kept(model, "kept_guard_runs", config, GuardRun)
    run.reset(everything=True)
    attached.put(model, "installed_guard", run)
    if probing_function is not None:
        probing_function.guard = run
    else:
        model.train_function = run.train_function
    return run


def detach_guard(model, probing_function=None):
    """Takes the guard out: the probe's function runs unguarded, or Keras' own comes back."""
    run = attached.pop(model, "installed_guard")
    if probing_function is not None:
        probing_function.guard = None
    if run is not None and model.train_function is run.train_function:
        model.train_function = run.keras_train_function if probing_function is None else probing_function


def check_guard(model):
    """Raises, before anything is installed, for what the guard does not do on JAX yet."""
    if model.optimizer is None:
        raise ValueError("NonFiniteGuard needs a compiled model: call model.compile(...) before fit.")
    if callable(getattr(model, "configure_probe", None)):  # a kgrad.ProbingModel
        raise UnsupportedBackendError(
            f"kgrad.NonFiniteGuard cannot guard this fit on Keras' JAX backend: model '{model.name}' is "
            "a kgrad.ProbingModel, which keeps only its latest probed record; after a trip the steps "
            "Keras' loop runs before it stops apply nothing and their records would replace it. Guard a "
            "plain keras.Model and pass kgrad.GradientProbe(...) to fit instead. Set "
            "KERAS_BACKEND=tensorflow, where it is supported."
        )


def probing_train_function(model, config, keras_function):
    """The `TrainFunction` probing ``model`` as ``config`` says."""
    return TrainFunction(model, config, keras_function, ProbedStep(model, config))


def attach(model, role, config):
    """Installs kgrad's train function for this ``fit``: ``role`` ``"probe"`` or ``"guard"``."""
    warn_of_keys_that_split_nothing(model)
    if role == "guard":
        return attach_guard(model, config, attached.get(model, "installation"))
    if model.optimizer is None:
        raise ValueError("GradientProbe needs a compiled model: call model.compile(...) before fit.")
    if has_own_train_step(model):
        check_stateless_train_step(model, "GradientProbe")
    function = _kept(model, "kept_train_functions", config, probing_train_function)
    function.guard = attached_guard(model)
    function.start_at(0)
    function.clear()  # what a fit that raised left unread is not this fit's
    attached.put(model, "installation", function)
    model.train_function = function
    return function


def detach(model, role):
    """Gives the model back Keras' own train function (or the guard's, while a guard stays attached)."""
    if role == "guard":
        return detach_guard(model, attached.get(model, "installation"))
    function = attached.pop(model, "installation")
    if function is not None and model.train_function is function:
        guard = attached_guard(model)
        model.train_function = function.keras_train_function if guard is None else guard.train_function


def unprobed_train_function(model):
    """The function for executions without a probed step: the guard's, else Keras' own."""
    function = attached.get(model, "installation")
    guard = attached_guard(model)
    if function is None:
        return None
    return function.keras_train_function if guard is None else guard.train_function


def check_supported(role):
    """Both roles, ``"probe"`` and ``"guard"``, run on JAX (with Keras' own ``train_step``)."""
    del role


def _kept(model, key, config, make):
    """The function (or guard run) of an earlier fit with the same options, else ``make``'s, kept."""
    keras_function = keras_train_function(model)
    kept = attached.setdefault(model, key, [])
    same = [f for f in kept if f.config == config and f.keras_train_function is keras_function]
    if same:
        return same[0]
    made = make(model, config, keras_function)
    kept[:] = [f for f in kept if f.keras_train_function is keras_function][-3:] + [made]
    return made
