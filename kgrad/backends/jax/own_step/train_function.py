"""The train function of a probed ``fit`` of a model with its own JAX ``train_step``.

Executions with a probed step run `OwnStepTrainFunction`: its probed step
traces the model's ``train_step`` with a `PartCollection` active, so each
`kgrad.value_and_grad` in it differentiates with capture
(`kgrad.backends.jax.own_step.part`), and returns the records beside
``(logs, state)``, one per named part: nothing leaves the jitted function
except as outputs. The other steps run the user's ``train_step`` untouched
(there `kgrad.value_and_grad` is ``jax.value_and_grad``), and executions
without a probed step run Keras' own function.
"""

import jax

from kgrad.backends.jax.differentiate.state_sharding import state_shardings
from kgrad.backends.jax.handover.records import RecordBuffer
from kgrad.backends.jax.own_step.active import activated
from kgrad.backends.jax.own_step.parts import PartCollection


class OwnStepTrainFunction:
    """``model.train_function`` for executions with a probed step of a model's own ``train_step``."""

    def __init__(self, model, config, keras_train_function=None):
        self.model, self.config = model, config
        self.guard = None  # the attached NonFiniteGuard's OwnStepGuardRun: every step guarded
        self.every_n_steps = config.every_n_steps
        self.buffer = _Buffers()  # part name -> RecordBuffer, filled when the probed step is traced
        self._names = {}  # part name -> (scalar names, histogram names)
        compile_steps = model.jit_compile and not model.run_eagerly
        # Under a keras.distribution the state stays where Keras' own train function keeps it.
        self._state_shardings = state_shardings(model)
        self._probed = (
            jax.jit(self._probed_step, donate_argnums=0, out_shardings=(None, self._state_shardings, None))
            if compile_steps
            else self._probed_step
        )
        self._plain = None  # the user's step, jitted on first use (executions of several steps)
        self._compile = compile_steps
        self.keras_train_function = keras_train_function or model.train_function
        self.latest_record = None
        self.guard_tripped = None
        self._next_step = 0

    def _probed_step(self, state, data):
        logs, state, records = self.guarded_probed_step(state, data, None)
        return logs, state, records

    def guarded_probed_step(self, state, data, checked):
        """The probed step; ``checked``: the guard's `CheckedParts` (around the probe's calls) or ``None``."""
        with PartCollection(self.model, self.config, state[0]) as parts:
            with activated(parts if checked is None else checked.around(parts)):
                logs, state = self.model.train_step(state, data)
        if not parts.parts and parts.calls:
            raise ValueError(
                f"kgrad.GradientProbe: kgrad.value_and_grad ran {parts.calls} time(s) in the train_step "
                f"of model '{self.model.name}', but none of the arrays it differentiated is a trainable "
                "value of the step's `state`, so no weight is known to log. Differentiate the values "
                "as they come from `state` (or list slices of it), not copies or transforms of them."
            )
        if not parts.parts:
            raise ValueError(
                f"kgrad.GradientProbe found no kgrad.value_and_grad in the train_step of model "
                f"'{self.model.name}' (class {type(self.model).__name__}), so it has nothing to log. "
                "In that train_step, replace `jax.value_and_grad(...)` with `kgrad.value_and_grad(...)` "
                "(same arguments; name=\"generator\" names its run)."
            )
        for part in parts.parts:
            if part.name not in self.buffer:
                self.buffer[part.name] = RecordBuffer(
                    lambda name=part.name: self._names[name], part.weight_shapes
                )
            self._names[part.name] = (part.rows.scalar_names, part.rows.histogram_names)
        return logs, state, parts.records()

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
                logs, state, records = self.guard.run_probed(self, state, data)
            else:
                logs, state, records = self._probed(state, data)
            for name, record in records.items():
                self.buffer[name].append(record)
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
        return dict(self.buffer)

    def guard_states(self):
        return {}

    def tripped_batch(self):
        return None

    def batch_not_kept(self):
        return None


class _Buffers(dict):
    """``{part name: RecordBuffer}``; `clear` drops what a fit that raised left unread, not the buffers."""

    def clear(self):
        for buffer in self.values():
            buffer.clear()
