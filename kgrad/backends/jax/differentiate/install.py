"""Installing the probed JAX step for one ``fit``: kgrad's train function in place of Keras'.

Keras' JAX ``fit`` calls ``model.train_function(state, iterator)`` for each
execution of ``steps_per_execution`` steps, a Python loop over a jitted
``train_step``. While a `kgrad.GradientProbe` is attached, executions that
hold a probed step run `ProbingTrainFunction` instead, which runs the same
steps, each either Keras' own ``train_step`` or the probed one
(`kgrad.backends.jax.differentiate.step.ProbedStep`): which one is known on
the host, so neither holds a branch. Executions without a probed step run
Keras' own function untouched.
"""

import jax

from kgrad.backends.common.own_step import check_stateless_train_step, has_own_train_step
from kgrad.backends.jax.differentiate.state_sharding import state_shardings
from kgrad.backends.jax.differentiate.step import ProbedStep
from kgrad.backends.jax.guard.install import (
    attach_guard,
    attached_guard,
    detach_guard,
    keras_train_function,
)
from kgrad.backends.jax.handover.records import RecordBuffer
from kgrad.backends.jax.own_step.train_function import OwnStepTrainFunction

_INSTALLATION = "_kgrad_jax_installation"
# Functions of earlier fits, kept on the model: tracing and compiling the probed
# step takes seconds, and a later fit with the same options runs them again.
_KEPT = "_kgrad_jax_train_functions"


class ProbingTrainFunction:
    """``model.train_function`` for executions with a probed step (an `interface.TrainingStep`)."""

    def __init__(self, model, config, keras_train_function=None):
        self.model, self.config = model, config
        self.guard = None  # the attached NonFiniteGuard's `GuardRun`: every step guarded
        self.every_n_steps = config.every_n_steps
        self.probed_step = ProbedStep(model, config)
        self.buffer = RecordBuffer(lambda: self.probed_step.names, self.probed_step.weight_shapes)
        compile_steps = model.jit_compile and not model.run_eagerly
        self._state_shardings = state_shardings(model)
        self._probed = (
            jax.jit(self.probed_step, donate_argnums=0, out_shardings=(None, self._state_shardings, None))
            if compile_steps
            else self.probed_step
        )
        self._plain = None  # Keras' own step, jitted on first use (executions of several steps)
        self._compile = compile_steps
        self.keras_train_function = keras_train_function or model.train_function
        self.latest_record = None
        self.guard_tripped = None
        self._next_step = 0

    def __call__(self, state, iterator):
        logs, state = self._run(state, next(iterator))
        for _ in range(self.model.steps_per_execution - 1):
            try:
                data = next(iterator)
            except StopIteration:
                break
            logs, state = self._run(state, data)
        return logs, state

    def _run(self, state, data):
        index, self._next_step = self._next_step, self._next_step + 1
        if index % self.every_n_steps == 0:
            if self.guard is not None:
                logs, state, record = self.guard.run_probed(self.probed_step, state, data)
            else:
                logs, state, record = self._probed(state, data)
            self.buffer.append(record)
            return logs, state
        if self.guard is not None:
            return self.guard.run_plain(state, data)
        if self._plain is None:
            step = self.model.train_step
            self._plain = (
                jax.jit(step, donate_argnums=0, out_shardings=(None, self._state_shardings))
                if self._compile
                else step
            )
        return self._plain(state, data)

    # -- what the callbacks ask (kgrad.backends.interface.TrainingStep) ---------------

    def start_at(self, first_step):
        self._next_step = first_step

    def start_epoch(self):
        pass

    def steps_run(self):
        return self._next_step

    def pipelines(self):
        return {None: self.buffer}

    def guard_states(self):
        return {}

    def tripped_batch(self):
        return None

    def batch_not_kept(self):
        return None


def attach(model, role, config):
    """Installs kgrad's train function for this ``fit``: ``role`` ``"probe"`` or ``"guard"``."""
    if role == "guard":
        return attach_guard(model, config, model.__dict__.get(_INSTALLATION))
    _check(model, role)
    keras_function = keras_train_function(model)
    kept = model.__dict__.setdefault(_KEPT, [])
    same = [f for f in kept if f.config == config and f.keras_train_function is keras_function]
    function = same[0] if same else None
    if function is None:
        # A model with its own train_step is probed through its kgrad.value_and_grad calls.
        kind = OwnStepTrainFunction if has_own_train_step(model) else ProbingTrainFunction
        function = kind(model, config, keras_function)
        kept[:] = [f for f in kept if f.keras_train_function is keras_function][-3:] + [function]
    function.guard = attached_guard(model)
    function.start_at(0)
    function.buffer.clear()  # what a fit that raised left unread is not this fit's
    object.__setattr__(model, _INSTALLATION, function)
    model.train_function = function
    return function


def detach(model, role):
    """Gives the model back Keras' own train function (or the guard's, while a guard stays attached)."""
    if role == "guard":
        return detach_guard(model, model.__dict__.get(_INSTALLATION))
    function = model.__dict__.pop(_INSTALLATION, None)
    if function is not None and model.train_function is function:
        guard = attached_guard(model)
        model.train_function = function.keras_train_function if guard is None else guard.train_function


def unprobed_train_function(model):
    """The function for executions without a probed step: the guard's, else Keras' own."""
    function = model.__dict__.get(_INSTALLATION)
    guard = attached_guard(model)
    if function is None:
        return None
    return function.keras_train_function if guard is None else guard.train_function


def check_supported(role):
    """Both roles, ``"probe"`` and ``"guard"``, run on JAX (with Keras' own ``train_step``)."""
    del role


def _check(model, role):
    check_supported(role)
    if model.optimizer is None:
        raise ValueError("GradientProbe needs a compiled model: call model.compile(...) before fit.")
    if has_own_train_step(model):
        check_stateless_train_step(model, "GradientProbe")
