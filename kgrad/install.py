"""Installing a probing ``train_step`` on a model for the length of a ``fit``.

`GradientProbe` and `NonFiniteGuard` each attach their part (summaries, finite
check) when ``fit`` starts; both share one `ProbingStep`, so a probed and
guarded step still runs a single backward pass. When the last one detaches,
the model gets back exactly what it had: no instance ``train_step``, its
previous ``train_function``.

Tracing the probing step takes seconds (a minute for a MobileNet), so it is
not redone by every ``fit``: the step and its traced functions are kept on the
model after ``fit`` (outside its tracked attributes), and a later ``fit`` with
the same options and the same compiled Keras function runs them again.
"""

import dataclasses

import keras

from kgrad import replicas
from kgrad.guard import TRIPPED_OUTPUT
from kgrad.model import ProbingModel
from kgrad.prebuild import build_before_tracing
from kgrad.state import RECORD_OUTPUT
from kgrad.step import SUMMARY_INPUTS_OUTPUT, ProbingStep

#: The attribute of `ProbingStep` each role sets.
_ROLE_ATTRIBUTES = {"probe": "config", "guard": "guard"}
_ROLE_CALLBACKS = {"probe": "GradientProbe", "guard": "NonFiniteGuard"}


@dataclasses.dataclass
class _Installation:
    step: ProbingStep
    previous_step: object
    train_function: object
    roles: set
    # Keras gives every fit() a new History; an installation whose History is
    # not the current one was left by a fit that raised (Keras has no
    # on_train_end then) and is undone before installing again.
    history: object


def _check_model(model, role):
    callback = _ROLE_CALLBACKS[role]
    if not isinstance(model, ProbingModel) and type(model).train_step is not keras.Model.train_step:
        raise ValueError(
            f"{callback} cannot probe model '{model.name}': its class "
            f"{type(model).__name__} defines its own train_step, which the probe "
            "would replace. Use kgrad.ProbeTape inside that train_step instead "
            "(replace `tf.GradientTape()` with `kgrad.ProbeTape(self)`)."
        )
    if "train_step" in model.__dict__:
        raise ValueError(
            f"{callback} cannot probe model '{model.name}': a train_step was set "
            "on the model instance by other code. Remove it, or use "
            "kgrad.ProbeTape inside that train_step instead."
        )
    if model.optimizer is None:
        raise ValueError(
            f"{callback} needs a compiled model: call model.compile(...) before fit."
        )
    replicas.check_strategy(model, f"kgrad.{callback}")


def _install(model, role):
    _check_model(model, role)
    if isinstance(model, ProbingModel):
        previous = model._probing_step()
        step = ProbingStep(model, config=previous.config)
        step.train_step = _restoring_on_error(model, step)
        model._set_probing_step(step)
    else:
        previous = None
        step = _kept_step(model)
        if step is None:
            step = ProbingStep(model)
            step.train_step = _restoring_on_error(model, step)
        object.__setattr__(model, "train_step", step.train_step)
    installation = _Installation(
        step, previous, model.train_function, set(), getattr(model, "history", None)
    )
    object.__setattr__(model, "_kgrad_installation", installation)
    return installation


def attach(model, role, part):
    """Attaches ``part`` (a config) as ``role`` and returns the shared step.

    Args:
        model: The model being fitted.
        role: ``"probe"`` or ``"guard"``.
        part: The `ProbeConfig` or `GuardConfig`.

    Raises:
        ValueError: If the role is already attached (two probes on one model),
            or the model cannot be probed.
    """
    installation = model.__dict__.get("_kgrad_installation")
    if installation is not None and installation.history is not getattr(model, "history", None):
        _uninstall(model, installation, keep=False)
        installation = None
    installation = installation or _install(model, role)
    if role in installation.roles:
        # Keras calls no on_train_end after this error: restore the model now.
        _uninstall(model, installation, keep=False)
        raise ValueError(
            f"Model '{model.name}' already has a {_ROLE_CALLBACKS[role]} attached in "
            f"this fit. Received a second one; pass a single {_ROLE_CALLBACKS[role]} "
            "per model (it can cover any set of layers)."
        )
    installation.roles.add(role)
    setattr(installation.step, _ROLE_ATTRIBUTES[role], part)
    installation.step.prepare()
    # Chosen (or traced) on the first batch, once every callback has attached.
    model.train_function = _TrainFunction(model, installation.step)
    return installation.step


def plain_train_function(model):
    """Keras' own train function, when steps that are not probed may use it.

    That is the case for a plain ``keras.Model`` with only a `GradientProbe`
    attached: the callback then runs the probing function only for the
    executions that contain a probed step, and every other execution runs
    exactly what Keras compiled. A `NonFiniteGuard` needs every step, and a
    `ProbingModel` probes inside its own step: ``None`` then.
    """
    installation = model.__dict__.get("_kgrad_installation")
    if (
        installation is None
        or isinstance(model, ProbingModel)
        or installation.roles != {"probe"}
        or installation.train_function is None
    ):
        return None
    return installation.train_function


def detach(model, role):
    """Detaches ``role``; the last one out restores the model as it was."""
    installation = model.__dict__.get("_kgrad_installation")
    if installation is None or role not in installation.roles:
        return
    installation.roles.discard(role)
    if not installation.roles:
        _uninstall(model, installation)


def _restoring_on_error(model, step):
    """``step.train_step``, restoring the model if tracing it raises.

    A bad request found while the step is traced (a layer with no float
    output, one run inside a loop...) makes ``fit`` raise, and Keras then
    calls no ``on_train_end``: without this, the model would keep probing.
    """
    train_step = step.train_step

    def train_step_restoring_on_error(data):
        try:
            return train_step(data)
        except Exception:
            installation = model.__dict__.get("_kgrad_installation")
            if installation is not None and installation.step is step:
                _uninstall(model, installation, keep=False)
            raise

    return train_step_restoring_on_error


def _uninstall(model, installation, keep=True):
    if isinstance(model, ProbingModel):
        model._set_probing_step(installation.previous_step)
    else:
        # pop: replicas tracing in parallel threads may both fail.
        model.__dict__.pop("train_step", None)
        if keep and installation.train_function is not None:
            # For the next fit: valid while Keras keeps this train function
            # (compile, or a new steps_per_execution, makes another).
            object.__setattr__(
                model, "_kgrad_kept", (installation.step, installation.train_function)
            )
    model.train_function = installation.train_function
    model.__dict__.pop("_kgrad_installation", None)


def _kept_step(model):
    """The step a previous fit left, if Keras still runs the same train function."""
    kept = model.__dict__.pop("_kgrad_kept", None)
    if kept is None or kept[1] is not model.train_function:
        return None
    step = kept[0]
    step.config = step.guard = None  # each callback attaches its part again
    return step


class _TrainFunction:
    """``model.train_function`` while kgrad is attached.

    On its first call every callback has attached its part, so the step knows
    what it will compute: the traced function for that is reused if the step
    has one, and traced otherwise.
    """

    def __init__(self, model, step):
        self._model = model
        self._step = step
        self._function = None

    def __call__(self, iterator):
        if self._function is None:
            # With one step per execution, a GradientProbe alone runs this
            # function for probed steps only (Keras' own for the others).
            self._step.only_probed_steps = (
                plain_train_function(self._model) is not None
                and self._model.steps_per_execution == 1
            )
            self._step.records_in_outputs = True
            # XLA compiles the step; its statistics run after it, uncompiled.
            self._step.summaries_after_step = self._step.only_probed_steps and bool(
                self._model.jit_compile and not self._model.run_eagerly
            )
            # Before any trace, so that the step (and Keras' own function
            # for unprobed steps) traces once.
            build_before_tracing(self._model, iterator)
            self._function = self._step.traced_function(self._make_function)
        outputs = self._function(iterator)
        if not isinstance(outputs, dict):
            return outputs
        outputs = dict(outputs)
        # Keras' logs must not show kgrad's outputs; the step keeps them.
        if TRIPPED_OUTPUT in outputs:
            self._step.guard_tripped = outputs.pop(TRIPPED_OUTPUT)
        summary_inputs = outputs.pop(SUMMARY_INPUTS_OUTPUT, None)
        if summary_inputs is not None:
            self._step.latest_record = self._step.summarize_after_step(summary_inputs)
        else:
            self._step.latest_record = outputs.pop(RECORD_OUTPUT, None)
        return outputs

    def _make_function(self):
        self._model.make_train_function(force=True)
        # Keras stores the new function as model.train_function; this stays.
        function, self._model.train_function = self._model.train_function, self
        return function
