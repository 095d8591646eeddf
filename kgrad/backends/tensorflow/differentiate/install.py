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


from kgrad.backends.common import attached
from kgrad.backends.tensorflow.handover import replicas
from kgrad.backends.tensorflow.differentiate.model import ProbingModel
from kgrad.backends.tensorflow.differentiate.step_plan import StepPlan
from kgrad.backends.tensorflow.differentiate.prebuild import build_before_tracing
from kgrad.backends.tensorflow.differentiate.step import ProbingStep

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
    # role -> its ProbeConfig / GuardConfig: what the plan is made of.
    parts: dict
    # With a probe and a guard: the guard-only function that executions
    # without a probed step run (made on first use).
    guard_only_function: object = None


def _check_model(model, role):
    callback = _ROLE_CALLBACKS[role]
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
    parts = {}
    if isinstance(model, ProbingModel):
        previous = model._probing_step()
        step = ProbingStep(model)
        step.train_step = _restoring_on_error(model, step)
        model._set_probing_step(step)
        parts["probe"] = model.probe_config  # unless a GradientProbe brings its own
    else:
        previous = None
        step = _kept_step(model)
        if step is None:
            step = ProbingStep(model)
            step.train_step = _restoring_on_error(model, step)
        object.__setattr__(model, "train_step", step.train_step)
    installation = _Installation(
        step, previous, model.train_function, set(), getattr(model, "history", None), parts
    )
    attached.put(model, "installation", installation)
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
    installation = attached.get(model, "installation")
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
    installation.parts[role] = part
    installation.step.prepare()
    # Chosen (or traced) on the first batch, once every callback has attached.
    model.train_function = _TrainFunction(model, installation)
    return installation.step


def unprobed_train_function(model):
    """The train function for executions without a probed step, if they may run another.

    For a plain ``keras.Model`` with a `GradientProbe`, executions that
    contain no probed step run something cheaper than the probing function:

    - with the probe alone, exactly what Keras compiled;
    - with a `NonFiniteGuard` too, the function of the guard alone (its
      sentinel, no capture), sharing the guard's device state with the
      probing function, so that the guard costs what it costs without a probe.

    ``None`` when every step runs the probing function: a guard without a
    probe (there is no probed step), or a `ProbingModel`, which probes inside
    its own step.
    """
    installation = attached.get(model, "installation")
    if (
        installation is None
        or isinstance(model, ProbingModel)
        or "probe" not in installation.roles
        or installation.train_function is None
    ):
        return None
    if installation.roles == {"probe"}:
        return installation.train_function
    if installation.guard_only_function is None:
        installation.guard_only_function = _TrainFunction(model, installation, guard_only=True)
    return installation.guard_only_function


def detach(model, role):
    """Detaches ``role``; the last one out restores the model as it was."""
    installation = attached.get(model, "installation")
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
            installation = attached.get(model, "installation")
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
            attached.put(model, "kept_step", (installation.step, installation.train_function))
    model.train_function = installation.train_function
    attached.pop(model, "installation")


def _kept_step(model):
    """The step a previous fit left, if Keras still runs the same train function."""
    kept = attached.pop(model, "kept_step")
    if kept is None or kept[1] is not model.train_function:
        return None
    return kept[0]


class _TrainFunction:
    """``model.train_function`` while kgrad is attached.

    On its first call every callback has attached its part, so the plan of
    the step is known: the function traced for that plan is reused if the
    step has one, and traced otherwise.
    """

    def __init__(self, model, installation, guard_only=False):
        self._model = model
        self._installation = installation
        self._guard_only = guard_only
        self._traced = None

    def plan(self):
        """The `StepPlan` for the parts attached now."""
        model, parts = self._model, self._installation.parts
        # With one step per execution, executions without a probed step run
        # another function (`unprobed_train_function`): this one runs probed
        # steps only.
        probed_steps_only = (
            not self._guard_only
            and unprobed_train_function(model) is not None
            and model.steps_per_execution == 1
        )
        return StepPlan(
            probe=None if self._guard_only else parts.get("probe"),
            guard=parts.get("guard"),
            steps_per_execution=model.steps_per_execution,
            probed_steps_only=probed_steps_only,
            records_in_outputs=True,
            # XLA compiles the step; its statistics run after it, uncompiled.
            statistics_after_step=probed_steps_only and bool(model.jit_compile and not model.run_eagerly),
            replicas=model.distribute_strategy.num_replicas_in_sync,
            compiles_step_inside=bool(
                parts.get("guard") is not None
                and model.steps_per_execution > 1
                and model.jit_compile
                and not model.run_eagerly
            ),
        )

    def __call__(self, iterator):
        step = self._installation.step
        if self._traced is None:
            plan = self.plan()
            # Before any trace, so that the step (and Keras' own function
            # for unprobed steps) traces once.
            build_before_tracing(self._model, iterator)
            self._traced = step.function_for(
                plan, lambda: self._make_function(plan), main=not self._guard_only
            )
        return step.run(self._traced, iterator)

    def _make_function(self, plan):
        if plan.compiles_step_inside:
            # Keras then compiles nothing: the step compiles its own body.
            self._model.jit_compile = False
            try:
                self._model.make_train_function(force=True)
            finally:
                self._model.jit_compile = True
        else:
            self._model.make_train_function(force=True)
        # Keras stores the new function as model.train_function; this stays.
        function, self._model.train_function = self._model.train_function, self
        return function
