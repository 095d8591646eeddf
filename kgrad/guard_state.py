"""The guard's device variables and the graph code of its every-step check and guarded update."""

import numpy as np
import tensorflow as tf

from kgrad import replicas, stats
from kgrad.guard import FORWARD_KINDS, TRIPPED_OUTPUT, NonFiniteReport, split_name
from kgrad.replay import BATCH_OUTPUT
from kgrad.replay_seeds import seed_generators
from kgrad.replicas import state_variable, sum_over_replicas


#: Kinds of checked tensors that loss scaling multiplies (see `GuardState.guarded_apply`).
SCALED_KINDS = frozenset({"loss", "weight_grad", "grad", "input_grad"})


class GuardState:
    """Device variables of the guard, and the graph code that fills them.

    Args:
        names: Tensor names (``"<kind>/<layer>"``) in check order.
        on_trip_only: Names of the tensors that are computed and checked on a
            tripped step only (see `watched_tensors`).
    """

    def __init__(self, names, on_trip_only=()):
        self.names = tuple(names)
        self.on_trip_only = frozenset(on_trip_only)
        count = len(self.names)
        self.tripped = state_variable(False, "kgrad_guard_tripped")
        self.trip_step = state_variable(tf.constant(-1, tf.int64), "kgrad_guard_step")
        self.counts = state_variable(tf.zeros([count, 2]), "kgrad_guard_counts")
        self.last_finite_step = state_variable(tf.constant(-1, tf.int64), "kgrad_guard_last_step")
        self.last_finite_half_squares = state_variable(tf.zeros([count]), "kgrad_guard_last_squares")

    def guarded_apply(self, tensors, step, apply, halt_updates, inverse_scale=None):
        """Checks ``tensors`` (in ``names`` order) and runs ``apply()`` if it may.

        Graph code: runs inside the train step, every step. A clean step costs
        one sum of squares per tensor, two branches (the check and the
        update) and two small selects (the record of the last finite step).
        ``apply`` runs when every tensor is finite and, with
        ``halt_updates``, no earlier step of the execution tripped; it also
        runs on a step whose sums overflowed but whose exact counts find no
        NaN or Inf. The tensors of ``on_trip_only`` names are zero-argument
        callables, called only when another tensor of the step is non-finite.

        ``inverse_scale`` (a scalar tensor, or ``None``): 1 / the loss scale
        the step's loss was multiplied by (mixed precision); the norms kept
        for the report are then those of the true loss and its gradients.

        Returns:
            A boolean tensor: whether ``apply`` ran.
        """
        every_step = [t for name, t in zip(self.names, tensors) if name not in self.on_trip_only]
        unscale = self._unscale_half_squares(inverse_scale)
        # Half sums of squares (`tf.nn.l2_loss`, one kernel each): non-finite
        # whenever an element is; the host doubles them for the norms.
        # Summed over replicas: every replica then takes the same branch and
        # the same apply decision, which the optimizer's all-reduce needs.
        half_squares = sum_over_replicas(
            tf.stack([tf.nn.l2_loss(tf.cast(t, tf.float32)) for t in every_step])
        )
        clean = tf.reduce_all(tf.math.is_finite(half_squares))
        if halt_updates:
            clean = tf.logical_and(clean, tf.logical_not(self.tripped))

        def locate():
            computed = [t() if name in self.on_trip_only else t for name, t in zip(self.names, tensors)]
            counts = sum_over_replicas(tf.stack([stats.count_nonfinite(t) for t in computed]))
            really_bad = tf.reduce_any(counts > 0)

            def record_trip():
                self.counts.assign(counts)
                self.trip_step.assign(tf.cast(step, tf.int64))
                self.tripped.assign(True)
                return tf.constant(False)

            first_trip = tf.logical_and(really_bad, tf.logical_not(self.tripped))
            # No NaN or Inf, only squares that overflowed: a clean step,
            # whose update is applied.
            return tf.cond(
                first_trip, record_trip, lambda: tf.logical_not(really_bad)
            )

        def not_clean():
            if not halt_updates:
                return locate()
            # After a trip the rest of the execution updates nothing, checks
            # nothing and keeps the last finite step from before the trip.
            return tf.cond(self.tripped, lambda: tf.constant(False), locate)

        # A clean step's branch holds nothing: the record of a finite step
        # is two small selects after it, not writes inside a branch that
        # runs every step (see benchmarks/RESULTS.md, "The guard's branches").
        may_apply = tf.cond(clean, lambda: tf.constant(True), not_clean)
        # Every applied step is a finite one (an overflowed sum is kept as
        # Inf, which the host reports as unknown).
        self.last_finite_half_squares.assign(
            tf.where(may_apply, self._spread(unscale(half_squares)), self.last_finite_half_squares)
        )
        self.last_finite_step.assign(
            tf.where(may_apply, tf.cast(step, tf.int64), self.last_finite_step)
        )

        def update():
            apply()
            return tf.no_op()

        # A branch of its own: the update is traced once (a large model's
        # update is a good part of its step's graph; tracing it into two
        # branches cost the MobileNet ~170 MB of peak memory).
        tf.cond(may_apply, update, tf.no_op)
        return may_apply

    def _unscale_half_squares(self, inverse_scale):
        """``fn(half squares of the every-step tensors) -> those of the unscaled loss's tensors``."""
        if inverse_scale is None:
            return lambda half_squares: half_squares
        # The loss and the gradients were multiplied by the scale; inputs,
        # activations and dJ/dŷ (of the compiled loss) were not.
        scaled = [
            split_name(name)[0] in SCALED_KINDS for name in self.names if name not in self.on_trip_only
        ]
        factors = tf.where(tf.constant(scaled), tf.square(tf.cast(inverse_scale, tf.float32)), 1.0)
        return lambda half_squares: half_squares * factors

    def _spread(self, every_step_values):
        """Values of the every-step tensors, at their places among ``names`` (0 elsewhere)."""
        if not self.on_trip_only:
            return every_step_values
        positions = [[i] for i, name in enumerate(self.names) if name not in self.on_trip_only]
        return tf.scatter_nd(positions, every_step_values, [len(self.names)])

    def read_report(self, last_summaries_for):
        """Host side: the `NonFiniteReport` of a tripped guard, or ``None``.

        Args:
            last_summaries_for: ``fn(layer, last_finite_step) -> dict``, the
                summaries of that layer from the latest finite probed step.
        """
        if not bool(self.tripped.numpy()):
            return None
        counts = self.counts.numpy()
        bad = {
            name: (int(nan), int(inf))
            for name, (nan, inf) in zip(self.names, counts)
            if nan > 0 or inf > 0
        }
        first = next(iter(bad))
        index = self.names.index(first)
        kind, layer = split_name(first)
        last_step = int(self.last_finite_step.numpy())
        return NonFiniteReport(
            step=int(self.trip_step.numpy()),
            tensor=first,
            layer=layer,
            kind=kind,
            pass_="forward" if kind in FORWARD_KINDS else "backward",
            nan_count=bad[first][0],
            inf_count=bad[first][1],
            last_finite_step=last_step if last_step >= 0 else None,
            last_finite_norm=_finite_or_none(
                np.sqrt(2.0 * self.last_finite_half_squares.numpy()[index])
                if last_step >= 0 and first not in self.on_trip_only
                else None
            ),
            last_summaries=last_summaries_for(layer, last_step if last_step >= 0 else None),
            non_finite=bad,
        )

    def reset(self, everything=False):
        """Re-arms the guard; with ``everything``, also forgets earlier steps."""
        self.tripped.assign(False)
        if everything:
            self.trip_step.assign(-1)
            self.counts.assign(tf.zeros_like(self.counts))
            self.last_finite_step.assign(-1)
            self.last_finite_half_squares.assign(tf.zeros_like(self.last_finite_half_squares))


def _finite_or_none(value):
    """A norm whose sum of squares overflowed is unknown, not Inf."""
    return float(value) if value is not None and np.isfinite(value) else None


class SharedGuardStates:
    """The `GuardState`s of one probing step, shared by all its traced functions.

    A `GradientProbe` with a `NonFiniteGuard` runs the guard-only function
    for executions without a probed step and the probing function for the
    others: both check the same tensors, so they share one trip flag and
    one "last finite step".

    Args:
        model: The model, whose distribution strategy creates the variables.
    """

    def __init__(self, model):
        self._model = model
        self._states = {}

    def get(self, tape_name, names, on_trip_only):
        """The state for ``names`` of a tape (``None``: the model's own), made on first use (in a trace)."""
        key = (tape_name, tuple(names), frozenset(on_trip_only))
        if key not in self._states:
            self._states[key] = replicas.create_variables(
                self._model, lambda: GuardState(names, on_trip_only)
            )
        return self._states[key]

    def reset(self, everything=False):
        """`GuardState.reset` of every state."""
        for state in self._states.values():
            state.reset(everything)


class TrippedBatch:
    """The batch of the step that tripped, kept on the device, for executions of several steps.

    With ``steps_per_execution > 1`` only the last step's outputs come back,
    so the tripped step keeps its own batch in variables of any batch size,
    written once, in the branch of a trip (a clean step writes nothing),
    with the states of the model's seed generators right after it (the
    steps after it draw on; the replay rewinds them, `kgrad.replay_seeds`).
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

    def keep_if(self, condition, data):
        """Graph code: writes ``data`` and the seed states into the variables when ``condition`` holds."""

        def keep():
            for variable, leaf in zip(self.variables, tf.nest.flatten(data)):
                variable.assign(leaf)
            for variable, generator in zip(self.seeds, self._generators):
                variable.assign(generator.state.value)
            self.kept.assign(True)
            return tf.constant(True)

        tf.cond(condition, keep, lambda: tf.constant(False))

    def read(self):
        """Host side: ``(batch, seed states)`` kept (the batch as device tensors), or ``None``.

        Re-arms the keeper: the next trip (``action="warn"``) keeps its own batch.
        """
        if not bool(self.kept.numpy()):
            return None
        self.kept.assign(False)
        values = [tf.identity(variable) for variable in self.variables]
        return tf.nest.pack_sequence_as(self._structure, values), [seed.numpy() for seed in self.seeds]

    def reset(self, everything=False):
        """Forgets the kept batch (``everything`` for the same call as `GuardState.reset`)."""
        self.kept.assign(False)


def keep_tripped_batch(model, traced, data, tripped):
    """Graph code, outside XLA: the batch of the step that trips, kept in ``traced.tripped_batch``.

    Under XLA the step compiles its own body and this runs after it
    (`kgrad.plan.StepPlan.compiles_step_inside`): XLA cannot write a batch
    of a new size into a variable.

    Args:
        tripped: The guard's flag after this step (a bool tensor).

    Returns:
        ``None`` when the batch is kept, else why it cannot be (strings,
        ragged or sparse tensors).
    """
    reason = _why_variables_cannot_hold(data)
    if reason is not None:
        return reason
    if traced.tripped_batch is None:
        traced.tripped_batch = replicas.create_variables(
            model, lambda: TrippedBatch(data, seed_generators(model))
        )
    # The first step that finds the guard tripped is the one that tripped it
    # (the steps after it see the same optimizer step: nothing was applied).
    kept = traced.tripped_batch
    kept.keep_if(tf.logical_and(tripped, tf.logical_not(kept.kept)), data)
    return None


def _why_variables_cannot_hold(data):
    """Why `TrippedBatch` cannot keep ``data``, or ``None`` when it can."""
    leaves = tf.nest.flatten(data)
    if not all(isinstance(leaf, tf.Tensor) and leaf.shape.rank for leaf in leaves):
        return "variables cannot hold inputs that are not dense batched tensors (ragged, sparse)"
    if not all(leaf.dtype.is_numpy_compatible and leaf.dtype != tf.string for leaf in leaves):
        return "variables cannot hold inputs that are not numbers (strings)"
    return None


def keeping_the_batch(model, traced, outputs, data):
    """Graph code: ``outputs`` of a guarded step, with its batch kept for the replay of a trip.

    The tripped step's batch is written into variables (`keep_tripped_batch`,
    in a branch that runs on a trip only; under XLA with several steps per
    execution after the compiled step, in `kgrad.step.ProbingStep.train_step`).
    With one step per execution, where variables cannot take it (a step
    compiled by XLA, which cannot write a batch of a new size into a
    variable; strings; ragged tensors), the step returns its own input
    tensors instead (`kgrad.replay.BATCH_OUTPUT`), which copies nothing to
    the host but costs every step: each output of Keras' train function
    costs it host time per step (measured on the benchmark MLP: ~1-3% of a
    step for the batch).
    """
    plan = traced.plan
    if plan.guard is None:
        return outputs
    if plan.steps_per_execution == 1 and (
        bool(model.jit_compile and not model.run_eagerly) or _why_variables_cannot_hold(data) is not None
    ):
        return {**outputs, BATCH_OUTPUT: data}
    if not plan.compiles_step_inside:
        traced.batch_not_kept = keep_tripped_batch(model, traced, data, outputs[TRIPPED_OUTPUT])
    return outputs
