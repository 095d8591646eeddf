"""The backward pass and update of one probing step, in its three forms.

`probed_update`: the plain backward pass, or on probed steps the one over the
captured tensors too and the summaries, in a ``tf.cond`` (none when every step
is probed). `guarded_update`: every step the full backward pass, the finite
check and an update only where it is finite. `every_step_update`: with
several replicas, summaries on every step (collectives cannot sit in a
branch), written only on probed steps. Each applies exactly the gradients of
the loss that Keras' own step would.
"""

import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.tensorflow.guard import watched as guard_module
from kgrad.plan import selection
from kgrad.backends.tensorflow.differentiate.branching import join_sparse, split_sparse
from kgrad.backends.tensorflow.summarize.loss_scale import inverse_loss_scale


def every_step_update(model, plan, pipeline, tape, loss, weights, x, prediction_gradient, probe_now, step):
    """Multi-replica: summaries of the global batch computed on every step.

    They are written only on probed steps; computing them on every step
    is the price of TensorFlow not allowing collectives inside a branch.
    """
    gradients = tape.gradient(loss, weights)
    builder = pipeline.summarize(tape.probe, gradients, weights, x, prediction_gradient, loss)
    model.optimizer.apply_gradients(zip(gradients, weights))
    pipeline.record(step, builder.scalars(), builder.histograms(), weights, where=probe_now)


def probed_update(model, plan, pipeline, tape, loss, weights, probe_now, x, prediction_gradient):
    """One backward pass: over the probed tensors too on probed steps only.

    Returns the scalars and histograms, or, when the statistics run after
    the step, the builder's inputs.
    """
    def probed():
        gradients = tape.gradient(loss, weights)
        builder = pipeline.summarize(tape.probe, gradients, weights, x, prediction_gradient, loss)
        if plan.defers_statistics:  # no branch then: every step is probed
            return split_sparse(gradients), pipeline.defer(builder)
        return split_sparse(gradients), (builder.scalars(), builder.histograms())

    def plain():
        return split_sparse(tape.plain_gradient(loss, weights)), pipeline.no_summaries()

    gradients, summaries = probed() if plan.probes_every_step else tf.cond(probe_now, probed, plain)
    model.optimizer.apply_gradients(zip(join_sparse(gradients, weights), weights))
    return summaries


def guarded_update(model, plan, traced, tape, loss, weights, probe_now, step, x, prediction_gradient,
                   shared_guard_state, keep_batch=None, put_back_forward_state=None):
    """Every step: one full backward pass, the finite check, a guarded apply.

    ``shared_guard_state(tape_name, names, on_trip_only)`` gives the step's
    `kgrad.backends.tensorflow.guard.sentinel.GuardState` for the checked tensors; ``keep_batch``
    (or ``None``) runs in the branch of a trip (`kgrad.backends.tensorflow.guard.tripped_batch.batch_keeper`;
    ``None`` under several replicas, each holding a slice of the batch),
    ``put_back_forward_state`` (or ``None``) in the branch of a skipped
    update (`kgrad.backends.tensorflow.differentiate.forward_state.state_before_forward`).
    Under several replicas the summaries are computed every step and recorded
    here, on probed steps, without a branch (as `every_step_update` does).
    """
    current = traced
    gradients = tape.gradient(loss, weights)
    probe = tape.probe
    watched, on_trip_only = guard_module.watched_tensors(
        plan.guard, model, probe, loss,
        prediction_gradient if keras_internals.compile_loss(model) is not None else None,
        gradients, weights, _guard_layer_names(model, plan),
    )
    names = [name for name, _ in watched]
    current.guard_state = shared_guard_state(
        None, names, on_trip_only, plan.guard.spikes, guard_module.scaler_owned(plan.guard, model, names)
    )
    summaries = (tf.zeros([0]), tf.zeros([0, 1, 3]))
    if plan.probe is not None:
        def probed():
            builder = current.pipeline.summarize(probe, gradients, weights, x, prediction_gradient, loss)
            return builder.scalars(), builder.histograms()

        # Several replicas: every step, since collectives cannot sit in a branch.
        summaries = probed() if plan.probes_every_step or plan.replicas > 1 else tf.cond(
            probe_now, probed, current.pipeline.no_summaries
        )

    def apply():
        model.optimizer.apply_gradients(zip(gradients, weights))

    # After the summaries, which read the weights before the update; the
    # loss scale is read before the update changes it.
    current.guard_state.guarded_apply(
        [tensor for _, tensor in watched], step, apply, plan.guard.halt_updates,
        inverse_loss_scale(model.optimizer), on_trip=keep_batch, on_skip=put_back_forward_state,
        spike_update=_spike_update(model, gradients, weights),
    )
    if plan.replicas > 1 and plan.probe is not None:  # no branch: the record's writes merge across replicas
        current.pipeline.record(step, *summaries, weights, where=probe_now)
    return summaries


def _spike_update(model, gradients, weights):
    """``(optimizer, the update's pairs, the checked pairs in their rows' order)``: `record_skip`'s."""
    applied = [(gradient, weight) for gradient, weight in zip(gradients, weights) if gradient is not None]
    # The guard's rows hold the weight gradients last to first (`watched_tensors`).
    return model.optimizer, applied, applied[::-1]


def _guard_layer_names(model, plan):
    probe, guard = plan.probe, plan.guard
    if probe is None or probe.layers is guard.layers:
        return None
    return list(selection.resolve_layers(model, guard.layers))
