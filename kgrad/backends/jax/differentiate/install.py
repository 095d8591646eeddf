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
import keras

from kgrad.backends import UnsupportedBackendError
from kgrad.backends.common.own_step import has_own_train_step
from kgrad.backends.jax.differentiate.step import ProbedStep
from kgrad.backends.jax.handover.records import RecordBuffer
from kgrad.backends.jax.own_step.train_function import OwnStepTrainFunction

_INSTALLATION = "_kgrad_jax_installation"
# Functions of earlier fits, kept on the model: tracing and compiling the probed
# step takes seconds, and a later fit with the same options runs them again.
_KEPT = "_kgrad_jax_train_functions"


class ProbingTrainFunction:
    """``model.train_function`` for executions with a probed step (an `interface.TrainingStep`)."""

    def __init__(self, model, config):
        self.model, self.config = model, config
        self.every_n_steps = config.every_n_steps
        self.probed_step = ProbedStep(model, config)
        self.buffer = RecordBuffer(lambda: self.probed_step.names, self.probed_step.weight_shapes)
        compile_steps = model.jit_compile and not model.run_eagerly
        self._state_shardings = _state_shardings(model)
        self._probed = (
            jax.jit(self.probed_step, donate_argnums=0, out_shardings=(None, self._state_shardings, None))
            if compile_steps
            else self.probed_step
        )
        self._plain = None  # Keras' own step, jitted on first use (executions of several steps)
        self._compile = compile_steps
        self.keras_train_function = model.train_function
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
            logs, state, record = self._probed(state, data)
            self.buffer.append(record)
            return logs, state
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


def _state_shardings(model):
    """Where the state lives under a `keras.distribution` (as Keras' train function keeps it), or ``None``.

    Under `keras.distribution.DataParallel` the batch is split over the devices
    and the step is one program over the global batch (GSPMD): the statistics
    kgrad reduces are those of the global batch, as on one device.
    """
    if keras.distribution.distribution() is None:
        return None
    return model._get_state_sharding_spec()


def attach(model, role, config):
    """Installs kgrad's train function for this ``fit``; ``role`` ``"probe"`` only on JAX for now."""
    _check(model, role, config)
    kept = model.__dict__.setdefault(_KEPT, [])
    same = [f for f in kept if f.config == config and f.keras_train_function is model.train_function]
    function = same[0] if same else None
    if function is None:
        # A model with its own train_step is probed through its kgrad.value_and_grad calls.
        kind = OwnStepTrainFunction if has_own_train_step(model) else ProbingTrainFunction
        function = kind(model, config)
        kept[:] = [f for f in kept if f.keras_train_function is model.train_function][-3:] + [function]
    function.start_at(0)
    function.buffer.clear()  # what a fit that raised left unread is not this fit's
    object.__setattr__(model, _INSTALLATION, function)
    model.train_function = function
    return function


def detach(model, role):
    """Gives the model back Keras' own train function."""
    function = model.__dict__.pop(_INSTALLATION, None)
    if function is not None and model.train_function is function:
        model.train_function = function.keras_train_function


def unprobed_train_function(model):
    """Keras' own train function, for executions without a probed step."""
    function = model.__dict__.get(_INSTALLATION)
    return None if function is None else function.keras_train_function


def check_supported(role):
    """Raises for the roles that do not run on JAX yet: the guard."""
    if role != "probe":
        raise UnsupportedBackendError(
            "kgrad.NonFiniteGuard does not run on Keras' JAX backend yet (kgrad.GradientProbe does). "
            "Set KERAS_BACKEND=tensorflow to guard this model, or remove the guard from callbacks."
        )


def _check(model, role, config):
    check_supported(role)
    if model.optimizer is None:
        raise ValueError("GradientProbe needs a compiled model: call model.compile(...) before fit.")
    unsupported = None
    if "attention" in config.instruments:
        unsupported = (
            "instruments=['attention'] (attention logits and entropy per head) is computed on "
            "TensorFlow only yet; 'optimizer', 'logits' and 'per_example' run on JAX"
        )
    elif config.instruments and has_own_train_step(model):
        unsupported = (
            f"instruments={list(config.instruments)!r} with the own train_step of model '{model.name}': "
            "on JAX the instruments run in Keras' own train_step only yet"
        )
    if unsupported is not None:
        raise UnsupportedBackendError(
            f"kgrad.GradientProbe cannot probe this fit on Keras' JAX backend: {unsupported}. "
            "Set KERAS_BACKEND=tensorflow, where it is supported."
        )
