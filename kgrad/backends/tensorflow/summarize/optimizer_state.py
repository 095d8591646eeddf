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
"""

import tensorflow as tf

from kgrad.backends.common.moment_rules import inner_optimizer, moment_rule
from kgrad.backends.tensorflow.handover import replicas

def _rms(tensor):
    return tf.sqrt(tf.reduce_mean(tf.square(tensor)))


def moment_statistics(rule, optimizer, index, gradient, sigmas):
    """``(adam_rms, outlier fraction or None)`` of one weight, from the moments after the step.

    Args:
        rule: What `moment_rule` returned.
        optimizer: The optimizer whose state is read (`inner_optimizer`).
        index: The weight's index in its state (``_get_variable_index``).
        gradient: The float32 gradient the optimizer will apply.
        sigmas: k of the outlier test.
    """
    one = tf.constant(1.0)
    beta_1 = tf.cast(optimizer.beta_1, tf.float32)
    beta_2 = tf.cast(optimizer.beta_2, tf.float32)
    epsilon = tf.cast(optimizer.epsilon, tf.float32)
    step = tf.cast(optimizer.iterations + 1, tf.float32)
    if rule == "adamax":
        first, peak = optimizer._m[index], optimizer._u[index]
        peak = tf.maximum(beta_2 * tf.cast(peak, tf.float32), tf.abs(gradient))
        return _rms(gradient / (peak + epsilon)), None
    first, second = optimizer._momentums[index], optimizer._velocities[index]
    first = tf.cast(first, tf.float32)
    first = first + (gradient - first) * (one - beta_1)
    second = tf.cast(second, tf.float32)
    second = second + (tf.square(gradient) - second) * (one - beta_2)
    second_correction = one - tf.pow(beta_2, step)
    if rule == "nadam":
        scaled = gradient / (tf.sqrt(second / second_correction) + epsilon)
    else:
        denominator = second
        if optimizer.amsgrad:
            denominator = tf.maximum(tf.cast(optimizer._velocity_hats[index], tf.float32), second)
        scaled = gradient * tf.sqrt(second_correction) / (tf.sqrt(denominator) + epsilon)
    first_hat = first / (one - tf.pow(beta_1, step))
    second_hat = second / second_correction
    variance = second_hat - tf.square(first_hat)
    # Where v̂ ≤ m̂² (one step of history: equal up to rounding) there is no
    # spread to measure against: not an outlier.
    outlier = (variance > 0) & (tf.abs(gradient - first_hat) > sigmas * tf.sqrt(tf.maximum(variance, 0.0)))
    outliers = tf.reduce_mean(tf.cast(outlier, tf.float32))
    return _rms(scaled), outliers


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
    applied = optimizer._clip_gradients(applied)
    for (weight, _), gradient in zip(present, applied):
        if id(weight) not in paths:
            continue
        try:
            index = optimizer._get_variable_index(weight)
        except KeyError:
            continue  # not among the optimizer's variables: it does not update it
        rms, outliers = moment_statistics(rule, optimizer, index, tf.cast(gradient, tf.float32), sigmas)
        builder.add_scalar(f"adam_rms/{paths[id(weight)]}", rms)
        if outliers is not None:
            builder.add_scalar(f"grad_outlier_fraction/{paths[id(weight)]}", outliers)
    return None
