"""``instruments=["logits"]``: how peaked and how large each output's logits are.

Per output, over the classes or vocabulary on the last axis, at every example
and position (padding included), on device:

===========================================  ================================================
``logit_max_<mean|max>/<output>``            max_j z_j (output-logit growth)
``logit_lse_<mean|max>/<output>``            log Σ_j exp z_j (what a z-loss penalizes)
``logit_entropy_<mean|max>/<output>``        −Σ_j p_j log p_j, p = softmax(z), in nats
``logit_top1_prob_<mean|max>/<output>``      max_j p_j
===========================================  ================================================

``_mean`` is the mean over examples and positions, ``_max`` the max over them.
When the model ends in a softmax, z are the logits behind it (Keras'
``_keras_logits``, or the Softmax op's input), as Keras' cross-entropies take
them; otherwise the output itself is taken as logits. A sigmoid output (its
entries are independent probabilities) and an output without a class axis
(rank < 2, or one entry on the last axis) get no tags and a reason.
"""

import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.tensorflow.handover import replicas
from kgrad.backends.tensorflow.summarize.norms import nan_max
from kgrad.plan.tag_names import io_names


def output_logits(output):
    """``(logits, None)`` of one model output, or ``(None, why not)``.

    Example:

    >>> import tensorflow as tf, keras
    >>> z = tf.constant([[1.0, 2.0, 3.0]])
    >>> output_logits(keras.activations.softmax(z))[0] is z
    True
    >>> output_logits(z)[0] is z, output_logits(tf.constant([[0.5]]))[1]
    (True, 'one entry on its last axis: no classes to compare')
    """
    if not tf.is_tensor(output) or not output.dtype.is_floating:
        return None, "not a float tensor"
    op = None if isinstance(output, tf.__internal__.EagerTensor) else getattr(output, "op", None)
    op_type = getattr(op, "type", None)
    if op_type == "Sigmoid":
        return None, "a sigmoid output: independent probabilities, not a distribution over its last axis"
    logits = keras_internals.keras_logits(output)
    if logits is None:
        logits = op.inputs[0] if op_type == "Softmax" else output
    if logits.shape.rank is None or logits.shape.rank < 2:
        return None, "no class axis (a rank below 2)"
    if logits.shape[-1] == 1:
        return None, "one entry on its last axis: no classes to compare"
    return logits, None


def logit_statistics(logits):
    """``{kind: per-position values}`` of `kgrad.plan.tag_names.LOGIT_KINDS`, over the last axis."""
    logits = tf.cast(logits, tf.float32)
    largest = nan_max(logits, axis=-1)  # a NaN logit: a NaN max, under XLA too
    log_sum_exp = tf.reduce_logsumexp(logits, axis=-1)
    log_probabilities = logits - log_sum_exp[..., tf.newaxis]
    # 0·log 0 = 0: a class with probability 0 adds nothing to the entropy.
    entropy = -tf.reduce_sum(tf.math.multiply_no_nan(log_probabilities, tf.exp(log_probabilities)), -1)
    return {
        "logit_max": largest,
        "logit_lse": log_sum_exp,
        "logit_entropy": entropy,
        "logit_top1_prob": tf.exp(largest - log_sum_exp),
    }


def add_logit_summaries(builder, model, prediction):
    """Adds the logit tags of every output of ``prediction`` to ``builder``.

    Args:
        builder: A `kgrad.backends.tensorflow.summarize.summaries.SummaryBuilder`.
        model: The model (for its output names).
        prediction: Its output (a tensor or a structure), from the probed step.

    Returns:
        ``dict`` output name -> why it has no tags (empty when every output has them).

    Example:

    >>> import keras, tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize.summaries import SummaryBuilder
    >>> builder = SummaryBuilder(histograms=False, bucket_count=1)
    >>> _ = builder.add_tensor("activation", "dense", tf.ones([1]))
    >>> add_logit_summaries(builder, None, tf.constant([[0.0, 0.0], [0.0, 10.0]]))
    {}
    >>> values = dict(zip(builder.scalar_names, builder.scalars().numpy().round(4).tolist()))
    >>> values["logit_max_mean/output"], values["logit_top1_prob_max/output"]
    (5.0, 1.0)
    """
    outputs = tf.nest.flatten(prediction)
    names = io_names(prediction, "output", getattr(model, "output_names", None))
    reasons = {}
    for name, output in zip(names, outputs):
        logits, reason = output_logits(output)
        if logits is None:
            reasons[name] = reason
            continue
        for kind, values in logit_statistics(logits).items():
            # Per position first: the batch gathered over replicas is [B, T], not [B, T, V].
            values = replicas.gather_batch(values)
            builder.add_scalar(f"{kind}_mean/{name}", tf.reduce_mean(values))
            builder.add_scalar(f"{kind}_max/{name}", nan_max(values))
    return reasons
