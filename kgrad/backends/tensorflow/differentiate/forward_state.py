"""The state a forward pass writes, put back on a step whose update the guard skips.

A training-mode forward pass writes more than activations: BatchNormalization
layers move their moving mean and variance towards the batch's statistics.
On a step whose input holds a NaN, those statistics become NaN before any
gradient exists, so skipping the update alone would leave a model that
predicts NaN (and a replay that blames the statistics). The guard therefore
reads the model's floating-point non-trainable variables before the forward
pass and assigns them back in the branch of a skipped update.

Reading a variable costs one small op and no copy (TensorFlow keeps the read
buffer and gives the variable a new one when the forward pass assigns it);
the assignments run on skipped steps only. A model without such variables
(no BatchNormalization, no frozen layer) pays nothing.

Example (eager here; the guard calls both halves inside its train step):

>>> import keras, numpy as np
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization()])
>>> put_back = state_before_forward(model)
>>> _ = model(np.array([[np.nan, 1.0]], "float32"), training=True)
>>> np.isnan(model.non_trainable_variables[0].numpy()).tolist()  # the moving mean
[True, False]
>>> put_back()
>>> model.non_trainable_variables[0].numpy().tolist()
[0.0, 0.0]
"""

import tensorflow as tf


def state_before_forward(model):
    """Reads the state the forward pass may write; returns the function that puts it back.

    Args:
        model: A built Keras model. Its floating-point non-trainable variables
            (BatchNormalization's moving statistics, frozen layers' weights)
            are read now; integer ones (seed generators' states, counters)
            are left alone: the replay rewinds the seeds itself.

    Returns:
        A zero-argument function that assigns every read value back (graph
        code, for the branch of a skipped update), or ``None`` when the
        model has no such variable.
    """
    variables = [v for v in model.non_trainable_variables if tf.as_dtype(v.dtype).is_floating]
    if not variables:
        return None
    # Read before the forward pass in program order: automatic control
    # dependencies then order each read before that variable's assignment.
    values = [tf.convert_to_tensor(variable) for variable in variables]

    def put_back():
        for variable, value in zip(variables, values):
            variable.assign(value)

    return put_back


def state_before_step(model, guard):
    """``(put_back, keep_metrics)``: `state_before_forward` with a guard, and what keeps the metrics.

    ``keep_metrics(traced, outputs) -> outputs`` runs after Keras' metrics
    update: with spike skipping, a skipped step leaves the metrics' variables
    as before it, as on JAX (the logs Keras gets stay the step's own).
    Without ``guard.spikes`` it changes nothing: a non-finite step's metrics
    are left as they were before spike skipping.
    """
    put_back = None if guard is None else state_before_forward(model)
    if guard is None or guard.spikes is None or not model.metrics_variables:
        return put_back, lambda traced, outputs: outputs
    variables = list(model.metrics_variables)
    values = [tf.convert_to_tensor(variable) for variable in variables]

    def keep_metrics(traced, outputs):
        applied = traced.guard_state.applied
        for variable, value in zip(variables, values):
            variable.assign(tf.where(applied, tf.convert_to_tensor(variable), value))
        return outputs

    return put_back, keep_metrics
