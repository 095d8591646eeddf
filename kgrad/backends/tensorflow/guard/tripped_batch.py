"""The batch of the step that trips the guard, kept on the device for its replay.

Where the tripped step's batch is kept depends on how the step runs:

- outside XLA, in Keras' own ``train_step``: in the guard's branch of a trip
  (`batch_keeper`, `kgrad.backends.tensorflow.guard.sentinel.GuardState.guarded_apply`'s
  ``on_trip``), so that a clean step runs no op for it;
- a model's own ``train_step`` (whose guarded applies may be several), and
  under XLA with several steps per execution: after the step, in a branch
  on the guard's flag (`keeping_the_batch`, `keep_tripped_batch`);
- where variables cannot hold it (one step per execution under XLA, which
  cannot write a batch of a new size into a variable; strings; ragged
  tensors): the step returns its own batch (`kgrad.backends.common.batch_dump.BATCH_OUTPUT`).

Example (graph code, inside a traced step)::

    keep = batch_keeper(model, traced, data)  # None where it cannot keep it there
    state.guarded_apply(tensors, step, apply, halt_updates=True, on_trip=keep)

With several steps per execution, Keras tells callbacks the execution's last
batch only: the kept batch comes with its index within the epoch, counted on
the device (`StepsInEpoch`).
"""

import tensorflow as tf

from kgrad.backends.tensorflow.handover import replicas
from kgrad.backends.tensorflow.guard.watched import TRIPPED_OUTPUT
from kgrad.backends.common.batch_dump import BATCH_OUTPUT
from kgrad.backends.tensorflow.guard.replay_seeds import seed_generators


class TrippedBatch:
    """The batch of the step that tripped, kept on the device, for executions of several steps.

    With ``steps_per_execution > 1`` only the last step's outputs come back,
    so the tripped step keeps its own batch in variables of any batch size,
    written once, in the branch of a trip (a clean step writes nothing),
    with the states of the model's seed generators right after it (the
    steps after it draw on; the replay rewinds them, `kgrad.backends.tensorflow.guard.replay_seeds`).
    Graph mode only: XLA cannot assign a variable a tensor of a new shape.

    Args:
        data: The step's data (a structure of tensors), for the variables' dtypes and shapes.
        generators: The model's `keras.random.SeedGenerator`s.
    """

    def __init__(self, data, generators=()):
        self._structure = data
        self.variables = [
            tf.Variable(
                tf.zeros([0] + [size or 0 for size in leaf.shape[1:]], leaf.dtype),
                shape=tf.TensorShape([None]).concatenate(leaf.shape[1:]),
                trainable=False,
                name="kgrad_guard_batch",
            )
            for leaf in tf.nest.flatten(data)
        ]
        self._generators = list(generators)
        self.seeds = [
            tf.Variable(tf.zeros(generator.state.shape, generator.state.dtype), trainable=False,
                        name="kgrad_guard_seed")
            for generator in self._generators
        ]
        self.kept = tf.Variable(False, trainable=False, name="kgrad_guard_batch_kept")
        self.batch_index = tf.Variable(
            tf.constant(-1, tf.int64), trainable=False, name="kgrad_guard_batch_index"
        )

    def keep(self, data, batch_index=None):
        """Graph code: writes ``data``, the seed states and ``batch_index`` (if given) into the variables."""
        for variable, leaf in zip(self.variables, tf.nest.flatten(data)):
            variable.assign(leaf)
        for variable, generator in zip(self.seeds, self._generators):
            variable.assign(generator.state.value)
        if batch_index is not None:
            self.batch_index.assign(batch_index)
        self.kept.assign(True)

    def keep_if(self, condition, data, batch_index=None):
        """Graph code: `keep` in a branch taken when ``condition`` holds."""

        def keep():
            self.keep(data, batch_index)
            return tf.constant(True)

        tf.cond(condition, keep, lambda: tf.constant(False))

    def read(self):
        """Host side: ``(batch, seed states, batch index)`` kept, or ``None``.

        The batch comes as device tensors; the batch index within the epoch
        is ``None`` where it was not counted (one step per execution: Keras
        gives it). Re-arms the keeper: the next trip (``action="warn"``)
        keeps its own batch.
        """
        if not bool(self.kept.numpy()):
            return None
        self.kept.assign(False)
        values = [tf.identity(variable) for variable in self.variables]
        # Written by every keep of a traced step that counts (several steps
        # per execution), never by one that does not: no reset needed.
        index = int(self.batch_index.numpy())
        return (
            tf.nest.pack_sequence_as(self._structure, values),
            [seed.numpy() for seed in self.seeds],
            index if index >= 0 else None,
        )

    def reset(self, everything=False):
        """Forgets the kept batch (``everything`` for the same call as `GuardState.reset`)."""
        self.kept.assign(False)


def batch_keeper(model, traced, data):
    """Graph code: what the guard's branch of a trip runs to keep ``data``, or ``None``.

    For Keras' own step outside XLA; elsewhere (see the module) ``None``, and
    `keeping_the_batch` keeps the batch. Sets ``traced.batch_not_kept`` to why
    variables cannot hold ``data``, if they cannot; under several replicas
    (each holding a slice of the batch) it keeps none, and says so.
    """
    plan = traced.plan
    if plan.replicas > 1:
        traced.batch_not_kept = _not_kept_on_replicas(plan)
        return None
    if plan.compiles_step_inside or _returns_its_batch(model, plan, data):
        return None
    traced.batch_not_kept = _why_variables_cannot_hold(data)
    if traced.batch_not_kept is not None:
        return None
    kept = _tripped_batch(model, traced, data)
    index = _count_step(traced)  # outside the branch: every step counts
    return lambda: kept.keep(data, index)


def keep_tripped_batch(model, traced, data, tripped):
    """Graph code, outside XLA: the batch of the step that trips, kept in ``traced.tripped_batch``.

    Runs after the step: under XLA the step compiles its own body and this
    runs after it (`kgrad.backends.tensorflow.differentiate.step_plan.StepPlan.compiles_step_inside`),
    since XLA cannot write a batch of a new size into a variable.

    Args:
        tripped: The guard's flag after this step (a bool tensor).

    Returns:
        ``None`` when the batch is kept, else why it cannot be (strings,
        ragged or sparse tensors).
    """
    reason = _why_variables_cannot_hold(data)
    if reason is not None:
        return reason
    # The first step that finds the guard tripped is the one that tripped it
    # (the steps after it see the same optimizer step: nothing was applied).
    kept = _tripped_batch(model, traced, data)
    kept.keep_if(tf.logical_and(tripped, tf.logical_not(kept.kept)), data, _count_step(traced))
    return None


def keeping_the_batch(model, traced, outputs, data, kept_on_trip=False):
    """Graph code: ``outputs`` of a guarded step, with its batch kept for the replay of a trip.

    ``kept_on_trip``: the guard's branch of a trip keeps it already
    (`batch_keeper`). Else the batch is written into variables after the
    step (`keep_tripped_batch`; under XLA with several steps per execution
    after the compiled step, in `kgrad.backends.tensorflow.differentiate.step.ProbingStep.train_step`). With
    one step per execution, where variables cannot take it, the step
    returns its own input tensors instead (`kgrad.backends.common.batch_dump.BATCH_OUTPUT`),
    which copies nothing to the host but costs every step: each output of
    Keras' train function costs it host time per step (measured on the
    benchmark MLP: ~1-3% of a step for the batch).
    """
    plan = traced.plan
    if plan.guard is not None and plan.replicas > 1:  # none kept (a model's own step too)
        traced.batch_not_kept = _not_kept_on_replicas(plan)
    if plan.guard is None or plan.replicas > 1:
        return outputs
    if _returns_its_batch(model, plan, data):
        return {**outputs, BATCH_OUTPUT: data}
    if not plan.compiles_step_inside and not kept_on_trip:
        traced.batch_not_kept = keep_tripped_batch(model, traced, data, outputs[TRIPPED_OUTPUT])
    return outputs


def _not_kept_on_replicas(plan):
    """Why no batch is kept for the replay under several replicas (see `batch_keeper`)."""
    return (
        f"Not replayed: the model trains on {plan.replicas} replicas, each holding a slice of "
        "the batch, and the replay runs one device's forward pass on the whole batch; train "
        "the same model on a single device to locate the NaN."
    )


def _returns_its_batch(model, plan, data):
    """Whether the step returns its batch: one step per execution, and variables cannot hold it."""
    return plan.steps_per_execution == 1 and (
        bool(model.jit_compile and not model.run_eagerly) or _why_variables_cannot_hold(data) is not None
    )


class StepsInEpoch:
    """Steps run since the epoch began, counted on the device: the batch index of a tripped step.

    With ``steps_per_execution > 1`` the callbacks learn only each
    execution's last batch; the step that trips may be any of them. One
    counter per model, shared by all its traced functions (a probe's
    executions alternate two), restarted by the host at each epoch's begin
    (an assignment enqueued on the device, no host sync). With one step
    per execution nothing is counted: Keras gives the batch.

    Example::

        steps = StepsInEpoch(model)
        steps.restart()  # host side, at an epoch's begin
        index = steps.count()  # graph code, once per step: this step's index
    """

    def __init__(self, model):
        self._model = model
        self._variable = None

    def count(self):
        """Graph code: this step's index within the epoch (a tensor), counting the step."""
        if self._variable is None:  # first trace: made outside it (`replicas.create_variables`)
            self._variable = replicas.create_variables(
                self._model, lambda: replicas.state_variable(tf.constant(0, tf.int64), "kgrad_steps_in_epoch")
            )
        # Read before the increment: automatic control dependencies keep
        # the program order of two uses of one variable.
        index = self._variable.read_value()
        self._variable.assign_add(1)
        return index

    def restart(self):
        """Host side: the next step is the epoch's first."""
        if self._variable is not None:
            self._variable.assign(0)


def _count_step(traced):
    """This step's index within the epoch, counted on the device where Keras cannot tell it, else ``None``."""
    if traced.plan.steps_per_execution == 1:
        return None
    return traced.steps_in_epoch.count()


def _tripped_batch(model, traced, data):
    """``traced.tripped_batch``, made on first use (in the trace, outside any branch)."""
    if traced.tripped_batch is None:
        traced.tripped_batch = replicas.create_variables(
            model, lambda: TrippedBatch(data, seed_generators(model))
        )
    return traced.tripped_batch


def _why_variables_cannot_hold(data):
    """Why `TrippedBatch` cannot keep ``data``, or ``None`` when it can."""
    leaves = tf.nest.flatten(data)
    if not all(isinstance(leaf, tf.Tensor) and leaf.shape.rank for leaf in leaves):
        return "variables cannot hold inputs that are not dense batched tensors (ragged, sparse)"
    if not all(leaf.dtype.is_numpy_compatible and leaf.dtype != tf.string for leaf in leaves):
        return "variables cannot hold inputs that are not numbers (strings)"
    return None
