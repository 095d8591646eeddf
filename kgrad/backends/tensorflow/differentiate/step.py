"""The probing ``train_step``: Keras' own step, plus capture on probed steps.

What the step computes is a `kgrad.backends.tensorflow.differentiate.step_plan.StepPlan`, chosen before it
is traced (`function_for`). Each step runs one forward pass inside a
`ProbeTape` and one backward pass. A ``tf.cond`` on the step index picks which
backward pass: the plain one over the weights (what Keras does), or, on probed
steps, the one over the weights *and* the captured activations and inputs,
followed by the summaries of a `summarize.pipeline.ProbePipeline`. Steps that
are not probed compute nothing more than Keras would, except the step-index
test. A function that runs only probed steps has no branch at all. A model's
own ``train_step`` runs in a `custom_step.TapeCollection`.

Under XLA, a function that runs only probed steps returns the tensors to
summarize instead of summarizing them (`traced.SUMMARY_INPUTS_OUTPUT`), and the
pipeline computes the statistics with TensorFlow's own kernels right after the
step: compiled into the step, they made the MobileNet's first XLA step ~3x
slower (81 against 26 CPU-s) and its peak memory 1.9x the plain step's.
"""

import warnings

import keras
import numpy as np
import tensorflow as tf

from kgrad.backends.common import batch_dump
from kgrad.backends.common.own_step import has_own_train_step
from kgrad.backends.tensorflow.capture import forward
from kgrad.backends.tensorflow.capture.tape import ProbeTape
from kgrad.backends.tensorflow.differentiate import forward_state, losses, updates
from kgrad.backends.tensorflow.differentiate import traced as traced_module
from kgrad.backends.tensorflow.differentiate.custom_step import run_own_train_step
from kgrad.backends.tensorflow.guard import shared_states, tripped_batch, watched as guard_module
from kgrad.backends.tensorflow.handover import replicas
from kgrad.backends.tensorflow.handover.state import RECORD_OUTPUT
from kgrad.backends.tensorflow.summarize.pipeline import ProbePipeline
from kgrad.plan import selection

class ProbingStep:
    """A probing replacement for ``model.train_step``.

    Args:
        model: The ``keras.Model`` to train and probe.
    """

    #: How many traced functions a step keeps (one per plan).
    MAX_TRACED = 4

    def __init__(self, model):
        self.model = model
        self._counter = None
        self._traced = []  # `Traced`, the most recently used last
        self._current = None  # the `Traced` of the probing function
        self._running = None  # the `Traced` that runs (or is traced) now
        self._guard_states = shared_states.SharedGuardStates(model)
        self._steps_in_epoch = tripped_batch.StepsInEpoch(model)
        self.guard_tripped = None  # the guard's flag as of the latest execution
        self.guard_batch = None  # the latest step's data, when the guard may replay it
        self.latest_record = None  # the record the latest execution returned

    @property
    def plan(self):
        """The `StepPlan` of the function that runs now, or ``None``."""
        return None if self._current is None else self._current.plan

    @property
    def state(self):
        """The `ProbeState` of the model's probe, or ``None``."""
        pipeline = None if self._current is None else self._current.pipeline
        return None if pipeline is None else pipeline.state

    def guard_states(self):
        """``{name: GuardState}`` of the latest execution: ``None`` for the model's own, else one per tape."""
        return traced_module.by_name(self._running, "guard_state", "tape_guard_states")

    def pipelines(self):
        """``{name: ProbePipeline}``: ``None`` for the model's own, else one per tape."""
        return traced_module.by_name(self._current, "pipeline", "tape_pipelines")

    def prepare(self):
        """Resets the probe schedule and buffers; call eagerly before ``fit`` trains."""
        replicas.check_strategy(self.model, "kgrad")
        if self._counter is None:
            self._counter = replicas.create_variables(
                self.model,
                lambda: replicas.state_variable(tf.constant(0, tf.int64), "kgrad_step_counter"),
            )
        self._counter.assign(0)
        self.guard_tripped = self.latest_record = self.guard_batch = None
        for traced in self._traced:
            for pipeline in [traced.pipeline, *traced.tape_pipelines.values()]:
                if pipeline is not None:
                    pipeline.reset()
            if traced.tripped_batch is not None:
                traced.tripped_batch.reset(everything=True)
        self._guard_states.reset(everything=True)

    def function_for(self, plan, make_function, main=True):
        """The traced train function for ``plan`` (a `Traced`): one traced earlier, or ``make_function()``.

        One traced by an earlier fit for the same plan is reused, with the
        buffers it writes; a new one is traced on its first call. ``main``:
        it is the probing function, whose records `pipelines` reads (the
        guard-only function of unprobed executions is not).
        """
        for index, traced in enumerate(self._traced):
            if traced.plan == plan:
                traced = self._traced.pop(index)
                break
        else:
            pipeline = None
            if plan.probe is not None and not has_own_train_step(self.model):
                pipeline = ProbePipeline(
                    self.model, plan.probe, plan.record_capacity, self.model.optimizer
                )
            # The function is traced on its first call (`run`), reading `_running.plan`.
            traced = traced_module.Traced(plan, None, pipeline, steps_in_epoch=self._steps_in_epoch)
            traced.function = make_function()
        if main:
            self._current = traced
        self._running = traced
        self._traced.append(traced)
        del self._traced[: -self.MAX_TRACED]
        return traced

    def run(self, traced, iterator):
        """Runs the function of ``traced`` (from `function_for`) and returns Keras' outputs."""
        self._running = traced
        return self.take_outputs(traced.function(iterator))

    def take_outputs(self, outputs):
        """Removes kgrad's entries from a train function's outputs and keeps them."""
        if not isinstance(outputs, dict):
            return outputs
        outputs, kgrad_outputs = traced_module.split_outputs(outputs)
        if guard_module.TRIPPED_OUTPUT in kgrad_outputs:
            self.guard_tripped = kgrad_outputs[guard_module.TRIPPED_OUTPUT]
        # A reference to the device tensors, read only if the guard trips.
        self.guard_batch = kgrad_outputs.get(batch_dump.BATCH_OUTPUT)
        summary_inputs = kgrad_outputs.get(traced_module.SUMMARY_INPUTS_OUTPUT)
        if summary_inputs is not None:
            step, tensors = summary_inputs
            self.latest_record = self._running.pipeline.summarize_after_step(
                step, tensors, self.model.trainable_weights
            )
        else:
            self.latest_record = kgrad_outputs.get(RECORD_OUTPUT)
        return outputs

    def start_at(self, step_index):
        """Tells the step that the next step is the ``step_index``-th of ``fit``.

        For executions that ran Keras' own function in between (no host
        sync: an assignment enqueued on the device).
        """
        if self.plan is not None and self.plan.probed_steps_only:
            return  # it probes every step it runs: no device write per execution
        # As np.int64: TensorFlow keeps the tensor of every distinct Python
        # int it converts, ~1.4 KiB per probed step for the whole process.
        self._counter.assign(np.int64(step_index))

    def steps_run(self):
        """Steps probed or not since `prepare`; reads device memory (a host sync)."""
        return 0 if self._counter is None else int(self._counter.numpy())

    def _probe_now(self):
        plan = self._running.plan
        if plan.probe is None:
            return tf.constant(False)
        if plan.probed_steps_only:
            return tf.constant(True)  # the schedule is kept on the host
        probe_now = plan.probe.schedule.probes(self._counter)
        self._counter.assign_add(1)
        return probe_now

    def _pipeline_for_tape(self, name, tape_model, scaler):
        pipelines = self._running.tape_pipelines
        if name not in pipelines:
            plan = self._running.plan
            # With the optimizer that scaled the tape's loss, if one did: the
            # statistics are of the true loss (`ProbePipeline._unscale`).
            pipelines[name] = ProbePipeline(
                tape_model, plan.probe, plan.record_capacity, scaler, name=name
            )
        return pipelines[name]

    def train_step(self, data):
        """Keras' ``train_step`` (or the model's own), with the probe on selected steps."""
        traced = self._running
        if not traced.plan.compiles_step_inside:
            return self._train_step(data, traced)
        if traced.compiled_step is None:
            traced.compiled_step = tf.function(
                lambda batch: self._train_step(batch, traced), jit_compile=True
            )
        outputs = traced.compiled_step(data)
        # Outside XLA, which cannot write a batch of a new size into a variable.
        traced.batch_not_kept = tripped_batch.keep_tripped_batch(
            self.model, traced, data, outputs[guard_module.TRIPPED_OUTPUT]
        )
        return outputs

    def _train_step(self, data, traced):
        model, plan = self.model, traced.plan
        if plan.probe is None and plan.guard is None:
            return type(model).train_step(model, data)
        if has_own_train_step(model):
            return tripped_batch.keeping_the_batch(model, traced, self._own_train_step(data), data)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        forward.build_if_needed(model, data)
        probe_now = self._probe_now()
        step = tf.identity(model.optimizer.iterations)
        # Before the forward pass writes it (BatchNormalization's statistics).
        put_back, keep_metrics = forward_state.state_before_step(model, plan.guard)
        with ProbeTape(
            model,
            layers=selection.captured_layers(model, plan),
            watch_inputs=plan.probe is not None and plan.probe.captures("input_gradient"),
            persistent=True, record_inputs=plan.records_layer_inputs,
            _record_attention=plan.records_attention,
            _integer_inputs="warn",  # only read where inputs are watched: dJ/dx is captured
        ) as tape:
            y_pred, loss = forward.forward_and_loss(model, x, y, sample_weight)
        if not model.trainable_weights:
            warnings.warn("The model does not have any trainable weights.", stacklevel=2)
            return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        weights = model.trainable_weights
        prediction_gradient = lambda: losses.compiled_prediction_gradient(  # noqa: E731
            model, y, y_pred, sample_weight
        )
        if plan.replicas > 1 and plan.guard is None:
            updates.every_step_update(
                model, plan, traced.pipeline, tape, loss, weights, x, prediction_gradient,
                probe_now, step,
            )
            return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        if plan.guard is None:
            summaries = updates.probed_update(
                model, plan, traced.pipeline, tape, loss, weights, probe_now, x, prediction_gradient
            )
        else:
            summaries = updates.guarded_update(
                model, plan, traced, tape, loss, weights, probe_now, step, x, prediction_gradient,
                self._guard_states.get, tripped_batch.batch_keeper(model, traced, data), put_back,
            )
        outputs = keep_metrics(traced, model.compute_metrics(x, y, y_pred, sample_weight=sample_weight))
        if plan.defers_statistics:
            # A tuple: tf.data's structures (Keras wraps the outputs in a
            # tf.experimental.Optional) take a list for one tensor.
            return {**outputs, traced_module.SUMMARY_INPUTS_OUTPUT: (step, tuple(summaries))}
        pipeline = traced.pipeline
        if pipeline is not None and pipeline.names is not None and plan.replicas == 1:
            if plan.probes_every_step:
                record = pipeline.record(step, *summaries, weights)
                if plan.records_in_outputs:
                    # The host takes the record written last from the outputs.
                    outputs = {**outputs, RECORD_OUTPUT: record}
            else:
                def write():
                    pipeline.record(step, *summaries, weights)
                    return tf.no_op()

                tf.cond(probe_now, write, tf.no_op)
        if plan.guard is not None:
            # The flag travels with the logs that Keras reads anyway.
            outputs = {**outputs, guard_module.TRIPPED_OUTPUT: traced.guard_state.flag()}
            outputs = tripped_batch.keeping_the_batch(model, traced, outputs, data, kept_on_trip=True)
        return outputs

    def start_epoch(self):
        """Host side, at an epoch's begin: restarts the count of steps within the epoch."""
        self._steps_in_epoch.restart()

    def tripped_batch(self):
        """``(data, seed states, batch index)`` of the step that tripped the guard (reads the device).

        The seed states are ``None`` when they are the model's own now, the
        batch index within the epoch where Keras' callbacks get it (one
        step per execution); the whole is ``None`` when the batch was not
        kept (see `batch_not_kept`).
        """
        if self.guard_batch is not None:
            return self.guard_batch, None, None
        kept = None if self._running is None else self._running.tripped_batch
        return None if kept is None else kept.read()

    def batch_not_kept(self):
        """Why the latest execution kept no batch for the guard's replay, or ``None``."""
        return None if self._running is None else self._running.batch_not_kept

    def _own_train_step(self, data):
        """The model's own ``train_step``, its ProbeTapes reporting to the pipelines."""
        return run_own_train_step(
            self.model, self._running.plan, data, self._probe_now(),
            self._pipeline_for_tape, self._guard_state_for_tape,
        )

    def _guard_state_for_tape(self, name, *key):  # `SharedGuardStates.get`'s names, on_trip_only, ...
        self._running.tape_guard_states[name] = self._guard_states.get(name, *key)
        return self._running.tape_guard_states[name]
