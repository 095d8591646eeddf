"""kgrad's JAX train function: every execution of a probed or guarded ``fit`` runs here.

Keras' JAX ``fit`` calls ``model.train_function(state, iterator)`` for each
execution of ``steps_per_execution`` steps, a Python loop over a jitted
``train_step``. `TrainFunction` runs the same steps, each one of:

- the probed step (one step in ``every_n_steps``, counted on the host, so
  that no step holds a branch): the model's step, Keras' own or its own,
  whose `kgrad.value_and_grad` calls capture
  (`kgrad.backends.jax.own_step.parts.ProbedStep`); its records stay
  on the device in one `RecordBuffer` per run;
- with a `kgrad.NonFiniteGuard` attached, the guard's step (its ``run_plain``
  and ``run_probed``: the sentinel inside the same pass);
- else Keras' own (or the model's own) ``train_step``, untouched.

`step_jit` jits each step as Keras' train function does: the state donated
and, under a ``keras.distribution``, kept where Keras keeps it. kgrad's own
steps (probed, guarded) are compiled with `KGRAD_STEP_COMPILER_OPTIONS`;
Keras' own step is compiled as Keras compiles it.
"""

import jax
import keras

from kgrad.backends.jax.handover.records import RecordBuffer
from kgrad.backends.jax.keras_internals import state_shardings

# XLA options of kgrad's compiled steps where the model's weights are split over
# devices (`keras.distribution.ModelParallel`), by platform. A probed step reads
# each weight before and after its donated update (``update_ratio/``): there,
# XLA's CPU copy insertion without its region analysis cannot see that every
# read of an old shard comes before the update overwrites it in place, and
# copies every shard, held through the step. With it the copies go: on an MLP
# 1024-2048-1024 split over 8 CPU devices, the probed step held 1.14x Keras'
# step's memory per device, and holds 1.013x (docs/sharded.md, "What it
# costs"). Copies change no value. Not set where every weight is whole on each
# device (one device, `DataParallel`), where the option made the probes hold
# more, not less (that MLP on one device: 1.27x of Keras' step against 1.15x;
# `benchmarks/step_memory.py`); nor on other platforms, where it is not measured.
KGRAD_STEP_COMPILER_OPTIONS = {"cpu": {"xla_cpu_copy_insertion_use_region_analysis": True}}


def step_jit(model):
    """``jit(step, outputs, donate_argnums=0, keras_step=False)``: ``step`` (state in first, out
    second of ``outputs``) jitted as Keras jits (the state donated; ``donate_argnums``: more).

    ``jit`` returns ``step`` itself when the model's steps do not run jitted.
    Where `splits_a_weight`, kgrad's steps get `KGRAD_STEP_COMPILER_OPTIONS`
    of the platform; Keras' own (``keras_step=True``) none, as Keras compiles it.
    Made before ``fit`` runs: Keras' loop takes the variables' values out of
    the model while it runs, and their shardings with them.
    """
    compiled = model.jit_compile and not model.run_eagerly
    state = (None, state_shardings(model))
    options = KGRAD_STEP_COMPILER_OPTIONS.get(jax.default_backend()) if splits_a_weight(model) else None

    def jit(step, outputs, donate_argnums=0, keras_step=False):
        if not compiled:
            return step
        return jax.jit(
            step, donate_argnums=donate_argnums, out_shardings=state + (None,) * (outputs - 2),
            compiler_options=None if keras_step else options,
        )

    return jit


def splits_a_weight(model):
    """Whether a ``keras.distribution`` splits one of ``model``'s weights over devices."""
    if keras.distribution.distribution() is None:
        return False
    return any(not variable.value.sharding.is_fully_replicated for variable in model.trainable_variables)


class TrainFunction:
    """``model.train_function`` for one ``fit`` (an `interface.TrainingStep` for the probe).

    Args:
        model: The compiled model.
        config: The `ProbeConfig` (``None``: no step is probed, the guard's function).
        keras_train_function: Keras' own train function, given back on detach.
        probed_step: ``fn(state, data, guard_hook=None) -> (logs, state, {run: record})``,
            with ``names`` (``{run: (scalar names, histogram names)}``, once traced)
            and ``weight_shapes`` (``{run: {path: shape}}``); ``None`` with ``config``.

    Attributes:
        guard: The attached guard's run (its ``run_plain``, ``run_probed``), or ``None``.
        buffers: ``{run: RecordBuffer}`` of the probed steps' records.
    """

    def __init__(self, model, config, keras_train_function, probed_step=None):
        self.model, self.config = model, config
        self.keras_train_function = keras_train_function
        self.probed_step = probed_step
        self.schedule = None if config is None else config.schedule
        self.guard = None
        self.buffers = {}
        for run in getattr(probed_step, "weight_shapes", {}):
            self._buffer(run)
        self._jit = step_jit(model)
        self._probed = None if probed_step is None else self._jit(probed_step, outputs=3)
        self._plain = None  # the model's step, jitted on first use (executions of several steps)
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
        if self.schedule is not None and self.schedule.probes(index):
            if self.guard is not None:
                logs, state, records = self.guard.run_probed(self.probed_step, state, data)
            else:
                logs, state, records = self._probed(state, data)
            for run, record in records.items():
                self._buffer(run).append(record)
            return logs, state
        if self.guard is not None:
            return self.guard.run_plain(state, data)
        if self._plain is None:
            self._plain = self._jit(self.model.train_step, outputs=2, keras_step=True)
        return self._plain(state, data)

    def _buffer(self, run):
        if run not in self.buffers:
            step = self.probed_step
            self.buffers[run] = RecordBuffer(lambda: step.names[run], step.weight_shapes[run])
        return self.buffers[run]

    def clear(self):
        """Drops the records a ``fit`` that raised left unread (the buffers stay)."""
        for buffer in self.buffers.values():
            buffer.clear()

    # -- what the callbacks ask (kgrad.backends.interface.TrainingStep) ---------------

    def start_at(self, first_step):
        self._next_step = first_step

    def start_epoch(self):
        pass

    def steps_run(self):
        return self._next_step

    def pipelines(self):
        return dict(self.buffers)

    def guard_states(self):
        return {}

    def tripped_batch(self):
        return None

    def batch_not_kept(self):
        return None
