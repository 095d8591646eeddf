"""The guard's check and guarded update under a tf.distribute strategy of several replicas.

Under ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy`` (the others are
refused before training, `kgrad.backends.tensorflow.handover.replicas.check_strategy`),
for Keras' own ``train_step`` and for each `kgrad.ProbeTape`'s apply in a
model's own (each part decided on its own values, as on one device).
Each replica of such a step holds its own slice of the batch;
the optimizer all-reduces the gradients inside ``apply_gradients``, through a
``merge_call``. A ``tf.cond`` in a replica's context cannot hold a branch
that calls ``merge_call``, so, as Keras' ``LossScaleOptimizer`` does, the
decision is taken in the cross-replica context (one ``merge_call`` per
step) and its branches run the update on every replica
(``call_for_each_replica``). The decision is taken once, from the global
batch's values, so every replica applies the same update or none.

The global batch's values, as on one device:

- the loss and the weight gradients are each replica's share of the
  global ones: they are summed over replicas before their squares and
  their NaN/Inf counts (one all-reduce of the gradients every step, the
  price of judging the global gradient norm);
- per-example tensors (inputs, activations, dJ/da, dJ/dŷ) are slices of
  the global batch: their squares and counts are summed over replicas.

Example (graph code, inside each replica of the traced step)::

    applied = replicated.guarded_apply(state, tensors, step, apply, True, None, None, None)
    replicated.unless_all_applied([applied], put_back)  # a model's own step, after its tapes
"""

import tensorflow as tf

from kgrad.backends.tensorflow.handover import replicas
from kgrad.backends.tensorflow.summarize import stats
from kgrad.report.non_finite import split_name

#: Kinds of checked tensors that are each replica's share of a global one (summed before squaring).
SHARED_KINDS = frozenset({"loss", "weight_grad"})


def guarded_apply(state, tensors, step, apply, halt_updates, inverse_scale, on_skip, spike_update):
    """`GuardState.guarded_apply` of one replica, its decision taken across replicas.

    Graph code of a replica's context. No batch is kept for the replay here
    (each replica holds a slice of it; see `kgrad.backends.tensorflow.guard.tripped_batch`).

    Returns:
        A boolean tensor: whether ``apply`` ran (on every replica).
    """
    context = tf.distribute.get_replica_context()
    every_step = [(name, t) for name, t in zip(state.names, tensors) if name not in state.on_trip_only]
    shared = {name: t for name, t in every_step if split_name(name)[0] in SHARED_KINDS}
    sliced = [tf.nn.l2_loss(tf.cast(t, tf.float32)) for name, t in every_step if name not in shared]
    # One all-reduce for the step (the strategy batches the list).
    sliced_squares, totals = context.all_reduce(
        tf.distribute.ReduceOp.SUM, [tf.stack(sliced) if sliced else tf.zeros([0]), list(shared.values())]
    )
    total = dict(zip(shared, totals))
    squares, position = [], 0
    for name, _ in every_step:
        if name in total:
            squares.append(tf.nn.l2_loss(tf.cast(total[name], tf.float32)))
        else:
            squares.append(sliced_squares[position])
            position += 1

    def counts():  # a replica's, in the branch of a step that is not clean
        computed = [t() if name in state.on_trip_only else t for name, t in zip(state.names, tensors)]
        zero = tf.zeros([2])
        local = tf.stack([zero if name in total else stats.count_nonfinite(t)
                          for name, t in zip(state.names, computed)])
        # The replica context of the branch's own call, not the step's.
        summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)
        return summed + tf.stack([stats.count_nonfinite(total[name]) if name in total else zero
                                  for name in state.names])

    # Only tensors and callables cross the merge: a weight would come back as
    # TensorFlow's distributed variable, not the Keras one.
    gradients = None
    if spike_update is not None:
        optimizer, update_pairs, measured = spike_update
        # The skip's per-weight values are those of the global gradients.
        gradients = ([g for g, _ in update_pairs], [total[name] for name in state.names if name in total
                                               and split_name(name)[0] == "weight_grad"])

    def in_cross_replica_context(strategy, squares, loss, step, inverse_scale, counts, apply, on_skip,
                                 gradients):
        first = lambda value: strategy.experimental_local_results(value)[0]  # noqa: E731

        def on_every_replica(fn):
            return lambda: strategy.extended.call_for_each_replica(lambda own: own(), args=(fn,))

        update = None
        if gradients is not None:
            replica_gradients, global_gradients = gradients
            weights = [w for _, w in update_pairs]
            checked = [(first(g), w) for g, (_, w) in zip(global_gradients, measured)]
            update = (optimizer, update_pairs, checked, lambda: strategy.extended.call_for_each_replica(
                lambda grads: optimizer.apply_gradients(zip(grads, weights)), args=(replica_gradients,)
            ))
        return state.decide(
            first(squares), lambda: first(on_every_replica(counts)()),
            first(loss), first(step), on_every_replica(apply), halt_updates,
            None if inverse_scale is None else first(inverse_scale), None,
            None if on_skip is None else on_every_replica(on_skip), update,
        )

    applied = context.merge_call(in_cross_replica_context, args=(
        tf.stack(squares), total["loss/loss"], step, inverse_scale, counts, apply, on_skip, gradients,
    ))
    state.applied = applied
    return applied


def unless_all_applied(applied, fn):
    """Graph code: runs ``fn()`` (on every replica) after a step where a guarded apply did not run.

    For a model's own ``train_step`` (`kgrad.backends.tensorflow.differentiate.custom_step`),
    whose forward-written state is put back once all its tapes' updates are
    decided. Under several replicas ``fn`` assigns mirrored variables, which
    a branch in a replica's context cannot (the assignment merges): the
    branch is taken in the cross-replica context, from ``applied``, which
    every replica holds the same (`guarded_apply`).

    Args:
        applied: Boolean tensors, what `guarded_apply` returned for each tape.
        fn: A zero-argument callable (e.g. `forward_state.state_before_forward`'s).
    """
    def skipped():
        fn()
        return tf.no_op()

    if not replicas.multi_replica():
        tf.cond(tf.reduce_all(tf.stack(applied)), tf.no_op, skipped)
        return

    def in_cross_replica_context(strategy, applied, skipped):
        def on_every_replica():
            strategy.extended.call_for_each_replica(lambda own: own(), args=(skipped,))
            return tf.no_op()

        decision = tf.reduce_all(tf.stack([strategy.experimental_local_results(a)[0] for a in applied]))
        tf.cond(decision, tf.no_op, on_every_replica)

    tf.distribute.get_replica_context().merge_call(in_cross_replica_context, args=(list(applied), skipped))
