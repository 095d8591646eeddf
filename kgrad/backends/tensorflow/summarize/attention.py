"""``instruments=["attention"]``: per attention layer and head, the largest score and the entropy.

On a probed step, from the query and key projections each attention layer
computed (captured by `kgrad.backends.tensorflow.capture.attention_calls`), on
the first ``attention_examples`` examples of the batch, the scores are computed
again, as the layer scores them: s = scale·q·k (then c·tanh(s/c) with a logit
soft-cap c), keys the layer masks (causal, padding, ``attention_mask``, sliding
window) left out. Fused kernels (``ops.dot_product_attention``) never show
their scores: kgrad needs only q and k, so it does not matter which kernel ran.

=================================================  =========================================
``attention_logit_max/<layer>/head_<h>``           max of s over the sub-batch, the query
                                                   and the allowed key positions
``attention_entropy/<layer>/head_<h>``             mean over the sub-batch and the query
                                                   positions of −Σ_j p_j log p_j (nats),
                                                   p = softmax of the allowed scores
=================================================  =========================================

Query positions with no allowed key (a padded query under a query mask) are
left out of both: the layer attends nowhere there. The statistics are of the
weights before attention dropout, in float32 whatever the layer's dtype.

The math is in `example_statistics` and `head_statistics`, functions of
(q, k, mask, scale, soft cap) only.
"""

import tensorflow as tf

from kgrad.backends.tensorflow.handover import replicas


def attention_scores(query, key, scale, soft_cap=None):
    """``[B, N, T, S]`` float32 scores of ``query`` ``[B, T, N, H]`` and ``key`` ``[B, S, K, H]``.

    With K < N key heads (grouped queries), query head n reads key head
    n // (N / K), as Keras' and KerasHub's grouped attention repeat them.

    Example:

    >>> import tensorflow as tf
    >>> q = tf.ones([1, 1, 2, 4]); k = tf.ones([1, 3, 1, 4])
    >>> attention_scores(q, k, scale=0.5).numpy().tolist()
    [[[[2.0, 2.0, 2.0]], [[2.0, 2.0, 2.0]]]]
    """
    query = tf.cast(query, tf.float32)
    key = tf.cast(key, tf.float32)
    query_heads, key_heads = query.shape[2], key.shape[2]
    if key_heads != query_heads:
        key = tf.repeat(key, query_heads // key_heads, axis=2)
    scores = tf.einsum("btnh,bsnh->bnts", query, key) * tf.cast(scale, tf.float32)
    if soft_cap is not None:
        soft_cap = tf.cast(soft_cap, tf.float32)
        scores = tf.tanh(scores / soft_cap) * soft_cap
    return scores


def example_statistics(scores, allowed):
    """Per example and head: ``(max score, sum of row entropies, rows)``, each ``[B, N]``.

    Args:
        scores: ``[B, N, T, S]`` float32 scores.
        allowed: A bool mask broadcastable to ``scores`` (True: the query may
            attend to the key), or ``None`` (every key allowed).

    Per example first, so that under ``tf.distribute`` the replicas' sub-batches
    are gathered before the reduction (`head_statistics`).
    """
    if allowed is None:
        allowed = tf.ones_like(scores, dtype=tf.bool)
    allowed = tf.broadcast_to(allowed, tf.shape(scores))
    negative_infinity = tf.constant(float("-inf"), tf.float32)
    masked = tf.where(allowed, scores, negative_infinity)
    rows = tf.reduce_any(allowed, axis=-1)  # [B, N, T]: rows that attend somewhere
    # A row with no allowed key has log-sum-exp −inf: replaced, then left out.
    log_sum_exp = tf.where(rows, tf.reduce_logsumexp(masked, axis=-1), 0.0)
    log_probabilities = scores - log_sum_exp[..., tf.newaxis]
    probabilities = tf.where(allowed, tf.exp(log_probabilities), 0.0)
    # 0·log 0 = 0: a key with probability 0 adds nothing to the entropy.
    entropy = -tf.reduce_sum(tf.math.multiply_no_nan(log_probabilities, probabilities), axis=-1)
    entropy = tf.where(rows, entropy, 0.0)
    largest = tf.reduce_max(masked, axis=[2, 3])
    return largest, tf.reduce_sum(entropy, axis=-1), tf.reduce_sum(tf.cast(rows, tf.float32), axis=-1)


def head_statistics(largest, entropy_sums, rows):
    """``(attention_logit_max, attention_entropy)`` per head, ``[N]`` each, from `example_statistics`.

    A head whose sub-batch has no row that attends anywhere gets −inf and NaN:
    there is nothing to measure (kgrad writes no zero for it).

    Example:

    >>> import tensorflow as tf
    >>> scores = tf.constant([[[[0.0, 0.0], [3.0, -1.0]]]])  # one example, head, 2 queries
    >>> allowed = tf.constant([[[[True, True], [True, False]]]])
    >>> largest, entropy = head_statistics(*example_statistics(scores, allowed))
    >>> largest.numpy().tolist(), [round(float(entropy[0]), 4)]  # (log 2 + 0) / 2
    ([3.0], [0.3466])
    """
    return tf.reduce_max(largest, axis=0), tf.reduce_sum(entropy_sums, axis=0) / tf.reduce_sum(rows, axis=0)


def add_attention_summaries(builder, calls, examples):
    """Adds the attention tags of every captured call to ``builder``.

    Args:
        builder: A `kgrad.backends.tensorflow.summarize.summaries.SummaryBuilder`.
        calls: The step's `kgrad.backends.tensorflow.capture.attention_calls.AttentionCall`s.
        examples: How many examples of the batch (per replica) are scored.
    """
    for call in calls:
        query, key = call.query[:examples], call.key[:examples]
        scores = attention_scores(query, key, call.scale, call.soft_cap)
        allowed = call.allowed(query, key, examples)
        per_example = [replicas.gather_batch(value) for value in example_statistics(scores, allowed)]
        largest, entropy = head_statistics(*per_example)
        heads = range(scores.shape[1])
        builder.add_scalars([f"attention_logit_max/{call.name}/head_{h}" for h in heads], largest)
        builder.add_scalars([f"attention_entropy/{call.name}/head_{h}" for h in heads], entropy)
