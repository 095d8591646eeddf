"""``instruments=["optimizer"]``: Adam's second-moment lag and gradient outliers, from its own state.

On probed steps, before the update, from the moments the optimizer holds and the
step's gradient (unscaled, summed over replicas, clipped as the optimizer clips),
the moments its update is about to write, computed as Keras' ``update_step``
computes them: m_t = m + (1 − β1)(g − m), v_t = v + (1 − β2)(g² − v), at step
t = ``iterations`` + 1. They are the state read back after the step.

=========================================  ==================================================
``adam_rms/<weight path>``                 RMS over the entries of g/(√v̂ + ε): the gradient
                                           in Adam's units (≈ 1: as big as Adam expects;
                                           ≫ 1: it outgrew the second moment, Wortsman et al.
                                           2023). Denominator as the optimizer's own: Adam and
                                           AdamW g·√(1 − β2^t)/(√v_t + ε) (AMSGrad: max of
                                           v̂'s), Nadam g/(√v̂ + ε), Adamax g/(u_t + ε)
``grad_outlier_fraction/<weight path>``    fraction of entries with |g − m̂| > k·√max(v̂ − m̂²,
                                           0), m̂ = m_t/(1 − β1^t), v̂ = v_t/(1 − β2^t), k =
                                           ``outlier_sigmas`` (6); entries with v̂ ≤ m̂² are
                                           not counted; not for Adamax (its u is a
                                           running max of |g|, not a second moment)
``update_rms/<weight path>``               ‖Δw‖/√n of the step, beside ``update_ratio/``
                                           (any optimizer; written by the pipeline's record)
=========================================  ==================================================

Lion, Adafactor, SGD (with or without momentum) and other optimizers keep no
second moment kgrad reads (`kgrad.backends.common.moment_rules.moment_rule`
says why): they get ``update_rms/`` only, and a warning, never a zero. Under a
``LossScaleOptimizer`` the inner optimizer's state is read. With ``gradient_accumulation_steps`` the moments
move every few steps only: nothing is computed, with a warning.

The weights are summarized together, in one pass: their g, m and v flattened and
concatenated, the elementwise formulas run once, and the per-weight means taken
by one segment sum over static segment ids. Per weight they were ~15 small kernels,
dispatched one by one: on a small model that dispatch, not the arithmetic, was the
cost (issue 42). A pass holds at most `CHUNK_ENTRIES` entries (a bigger weight is a
pass of its own), so that its temporaries stay as small as one weight's would be.
"""

import math

import numpy as np
import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.common.moment_rules import inner_optimizer, moment_rule
from kgrad.backends.tensorflow.handover import replicas

#: The most entries one pass concatenates: beyond it the kernels are big enough
#: that dispatching them per chunk costs nothing, and the copies would cost memory.
CHUNK_ENTRIES = 1 << 22


def flat_entries(tensors):
    """The float32 entries of ``tensors``, flattened and concatenated (one tensor: no copy)."""
    flat = [tf.reshape(tf.cast(tensor, tf.float32), [-1]) for tensor in tensors]
    return flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)


def _hyperparameters(optimizer):
    """``(β1, β2, ε, t)`` as float32 scalars, t = ``iterations`` + 1 (the step being taken)."""
    return tuple(
        tf.cast(value, tf.float32)
        for value in (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon, optimizer.iterations + 1)
    )


def _slot_entries(optimizer, name, indices):
    """One of the optimizer's states (`keras_internals.slots`) for these weights, concatenated."""
    state = keras_internals.slots(optimizer, name)
    return flat_entries([state[index] for index in indices])


def _scaled_and_outliers(rule, optimizer, indices, gradient, hyperparameters, sigmas):
    """Elementwise over the concatenated entries: g in Adam's units, and the outlier flags (or ``None``)."""
    beta_1, beta_2, epsilon, step = hyperparameters
    one = tf.constant(1.0)
    if rule == "adamax":
        peak = _slot_entries(optimizer, "u", indices)
        peak = tf.maximum(beta_2 * peak, tf.abs(gradient))
        return gradient / (peak + epsilon), None
    first = _slot_entries(optimizer, "momentums", indices)
    first = first + (gradient - first) * (one - beta_1)
    second = _slot_entries(optimizer, "velocities", indices)
    second = second + (tf.square(gradient) - second) * (one - beta_2)
    second_correction = one - tf.pow(beta_2, step)
    if rule == "nadam":
        scaled = gradient / (tf.sqrt(second / second_correction) + epsilon)
    else:
        denominator = second
        if optimizer.amsgrad:
            peaks = _slot_entries(optimizer, "velocity_hats", indices)
            denominator = tf.maximum(peaks, second)
        scaled = gradient * tf.sqrt(second_correction) / (tf.sqrt(denominator) + epsilon)
    first_hat = first / (one - tf.pow(beta_1, step))
    second_hat = second / second_correction
    variance = second_hat - tf.square(first_hat)
    # Where v̂ ≤ m̂² (one step of history: equal up to rounding) there is no
    # spread to measure against: not an outlier.
    outlier = (variance > 0) & (tf.abs(gradient - first_hat) > sigmas * tf.sqrt(tf.maximum(variance, 0.0)))
    return scaled, outlier


def _chunk_statistics(rule, optimizer, indices, gradients, sizes, hyperparameters, sigmas):
    """``(rms [n], outlier fraction [n] or None)`` of the weights of one pass."""
    scaled, outlier = _scaled_and_outliers(
        rule, optimizer, indices, flat_entries(gradients), hyperparameters, sigmas
    )
    columns = [tf.square(scaled)]
    if outlier is not None:
        columns.append(tf.cast(outlier, tf.float32))
    # Static segment ids: weight k's entries are the k-th run of sizes[k] entries.
    segment_ids = tf.constant(np.repeat(np.arange(len(sizes), dtype=np.int32), sizes))
    sums = tf.math.unsorted_segment_sum(tf.stack(columns, axis=1), segment_ids, len(sizes))
    # An empty weight's mean is 0/0: NaN, as reduce_mean's.
    means = sums / tf.constant(np.asarray(sizes, np.float32)[:, np.newaxis])
    return tf.sqrt(means[:, 0]), (means[:, 1] if outlier is not None else None)


def chunks(sizes, limit):
    """Consecutive ``range``s of positions whose sizes add up to at most ``limit`` (or one bigger size)."""
    start, entries = 0, 0
    for position, size in enumerate(sizes):
        if position > start and entries + size > limit:
            yield range(start, position)
            start, entries = position, 0
        entries += size
    if start < len(sizes):
        yield range(start, len(sizes))


def moment_statistics(rule, optimizer, indices, gradients, sigmas, chunk_entries=CHUNK_ENTRIES):
    """``(adam_rms [n], outlier fractions [n] or None)`` of n weights, from the moments after the step.

    Args:
        rule: What `moment_rule` returned.
        optimizer: The optimizer whose state is read (`inner_optimizer`).
        indices: The weights' indices in its state (``_get_variable_index``).
        gradients: The gradients the optimizer will apply, one per index.
        sigmas: k of the outlier test.
        chunk_entries: The most entries one pass concatenates.

    Example:

    >>> import keras, tensorflow as tf
    >>> kernel, bias = keras.Variable(tf.ones([2, 2])), keras.Variable(tf.zeros([3]))
    >>> optimizer = keras.optimizers.Adam()
    >>> optimizer.build([kernel, bias])
    >>> gradients = [tf.ones([2, 2]), tf.constant([2.0, -2.0, 2.0])]
    >>> rms, outliers = moment_statistics("adam", optimizer, [0, 1], gradients, sigmas=6.0)
    >>> rms.numpy().round(4).tolist()  # at step 1 Adam's update is sign(g): RMS 1
    [1.0, 1.0]
    """
    # Static sizes, from the state's variables (shaped as their weights).
    first = keras_internals.slots(optimizer, "m" if rule == "adamax" else "momentums")
    sizes = [math.prod(first[index].shape) for index in indices]
    hyperparameters = _hyperparameters(optimizer)
    rms, outliers = [], []
    for chunk in chunks(sizes, chunk_entries):
        chunk_rms, chunk_outliers = _chunk_statistics(
            rule, optimizer, [indices[k] for k in chunk], [gradients[k] for k in chunk],
            [sizes[k] for k in chunk], hyperparameters, sigmas,
        )
        rms.append(chunk_rms)
        outliers.append(chunk_outliers)
    if outliers[0] is None:
        return _joined(rms), None
    return _joined(rms), _joined(outliers)


def adam_rms_per_weight(rule, optimizer, indices, gradients):
    """``[n]`` adam_rms of n weights (`moment_statistics`' first value), one reduction per weight.

    No concatenation and no segment sum: the spike rule's samples take it
    every few steps (`kgrad.backends.tensorflow.guard.spike_samples`), where
    `moment_statistics`' passes cost ~2.6 steps of the benchmark MLP.

    >>> import keras, tensorflow as tf
    >>> kernel = keras.Variable(tf.ones([2, 2]))
    >>> optimizer = keras.optimizers.Adam()
    >>> optimizer.build([kernel])
    >>> adam_rms_per_weight("adam", optimizer, [0], [tf.ones([2, 2])]).numpy().round(4).tolist()
    [1.0]
    """
    hyperparameters = _hyperparameters(optimizer)
    return tf.stack([
        # The outlier flags (k = ∞) are not used, and are pruned from the graph.
        tf.sqrt(tf.reduce_mean(tf.square(_scaled_and_outliers(
            rule, optimizer, [index], flat_entries([gradient]), hyperparameters, float("inf"),
        )[0])))
        for index, gradient in zip(indices, gradients)
    ])


def _joined(parts):
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)


def add_optimizer_summaries(builder, optimizer, gradients, weights, paths, unscale, sigmas):
    """Adds ``adam_rms/`` and ``grad_outlier_fraction/`` of the weights in ``paths``.

    Args:
        builder: A `kgrad.backends.tensorflow.summarize.summaries.SummaryBuilder`.
        optimizer: The optimizer that applies ``gradients`` (or its ``LossScaleOptimizer``).
        gradients: The tape's gradients of ``weights`` (of the possibly scaled loss).
        weights: The trainable weights, before the update.
        paths: ``dict`` id(weight) -> tag path, of the weights to summarize.
        unscale: ``fn(gradient) -> float32 gradient of the true loss``.
        sigmas: k of the outlier test.

    Returns:
        ``None``, or why nothing was added.
    """
    rule, reason = moment_rule(optimizer)
    if rule is None:
        return reason
    optimizer = inner_optimizer(optimizer)
    present = [(w, g) for w, g in zip(weights, gradients) if g is not None]
    applied = [replicas.sum_over_replicas(unscale(tf.convert_to_tensor(g))) for _, g in present]
    # What the optimizer applies: clipnorm, clipvalue, global_clipnorm.
    applied = keras_internals.clip_gradients(optimizer, applied)
    names, indices, summarized = [], [], []
    for (weight, _), gradient in zip(present, applied):
        if id(weight) not in paths:
            continue
        try:
            index = keras_internals.variable_index(optimizer, weight)
        except KeyError:
            continue  # not among the optimizer's variables: it does not update it
        names.append(paths[id(weight)])
        indices.append(index)
        summarized.append(gradient)
    if not names:
        return None
    rms, outliers = moment_statistics(rule, optimizer, indices, summarized, sigmas)
    builder.add_scalars([f"adam_rms/{name}" for name in names], rms)
    if outliers is not None:
        builder.add_scalars([f"grad_outlier_fraction/{name}" for name in names], outliers)
    return None
