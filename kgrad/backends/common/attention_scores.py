"""``instruments=["attention"]``: per attention layer and head, the largest score and the entropy.

Written once in ``keras.ops`` for every backend (compiled by XLA on TensorFlow,
jitted on JAX). On a probed step, from the query and key projections each
attention layer computed (captured by `kgrad.backends.common.attention_calls`),
on the first ``attention_examples`` examples of the batch, the scores are computed
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
(q, k, mask, scale, soft cap) only; `call_statistics` applies them to one call.
"""

from keras import ops

from kgrad.backends.common.norms import nan_max


def attention_scores(query, key, scale, soft_cap=None):
    """``[B, N, T, S]`` float32 scores of ``query`` ``[B, T, N, H]`` and ``key`` ``[B, S, K, H]``.

    With K < N key heads (grouped queries), query head n reads key head
    n // (N / K), as Keras' and KerasHub's grouped attention repeat them.

    Example:

    >>> from keras import ops
    >>> q = ops.ones([1, 1, 2, 4]); k = ops.ones([1, 3, 1, 4])
    >>> ops.convert_to_numpy(attention_scores(q, k, scale=0.5)).tolist()
    [[[[2.0, 2.0, 2.0]], [[2.0, 2.0, 2.0]]]]
    """
    query = ops.cast(query, "float32")
    key = ops.cast(key, "float32")
    query_heads, key_heads = query.shape[2], key.shape[2]
    if key_heads != query_heads:
        key = ops.repeat(key, query_heads // key_heads, axis=2)
    scores = ops.einsum("btnh,bsnh->bnts", query, key) * ops.cast(scale, "float32")
    if soft_cap is not None:
        soft_cap = ops.cast(soft_cap, "float32")
        scores = ops.tanh(scores / soft_cap) * soft_cap
    return scores


def example_statistics(scores, allowed):
    """Per example and head: ``(max score, sum of row entropies, rows)``, each ``[B, N]``.

    Args:
        scores: ``[B, N, T, S]`` float32 scores.
        allowed: A bool mask broadcastable to ``scores`` (True: the query may
            attend to the key), or ``None`` (every key allowed).

    Per example first, so that under ``tf.distribute`` the replicas' sub-batches
    can be gathered before the reduction (`head_statistics`).
    """
    if allowed is None:
        allowed = ops.ones_like(scores, dtype="bool")
    allowed = ops.broadcast_to(allowed, ops.shape(scores))
    masked = ops.where(allowed, scores, float("-inf"))
    rows = ops.any(allowed, axis=-1)  # [B, N, T]: rows that attend somewhere
    # A row with no allowed key would have log-sum-exp −inf (NaN in some kernels):
    # its scores are replaced by zeros, its result by 0, and the row is left out.
    log_sum_exp = ops.where(rows, ops.logsumexp(ops.where(rows[..., None], masked, 0.0), axis=-1), 0.0)
    log_probabilities = scores - log_sum_exp[..., None]
    probabilities = ops.where(allowed, ops.exp(log_probabilities), 0.0)
    # 0·log 0 = 0: a key with probability 0 adds nothing to the entropy.
    entropy = -ops.sum(ops.where(probabilities > 0, log_probabilities * probabilities, 0.0), axis=-1)
    entropy = ops.where(rows, entropy, 0.0)
    largest = ops.max(masked, axis=(2, 3))
    return largest, ops.sum(entropy, axis=-1), ops.sum(ops.cast(rows, "float32"), axis=-1)


def head_statistics(largest, entropy_sums, rows):
    """``(attention_logit_max, attention_entropy)`` per head, ``[N]`` each, from `example_statistics`.

    A head whose sub-batch has no row that attends anywhere gets −inf and NaN:
    there is nothing to measure (kgrad writes no zero for it).

    Example:

    >>> from keras import ops
    >>> scores = ops.convert_to_tensor([[[[0.0, 0.0], [3.0, -1.0]]]])  # one example, head, 2 queries
    >>> allowed = ops.convert_to_tensor([[[[True, True], [True, False]]]])
    >>> largest, entropy = head_statistics(*example_statistics(scores, allowed))
    >>> ops.convert_to_numpy(largest).tolist(), [round(float(entropy[0]), 4)]  # (log 2 + 0) / 2
    ([3.0], [0.3466])
    """
    # Over the examples (split over devices under a keras.distribution): a NaN stays a NaN.
    return nan_max(largest, axis=0), ops.sum(entropy_sums, axis=0) / ops.sum(rows, axis=0)


def call_statistics(call, examples, gather_batch=None):
    """``(name, attention_logit_max [N], attention_entropy [N])`` of one attention call.

    Args:
        call: A `kgrad.backends.common.attention_calls.AttentionCall`.
        examples: How many examples of the batch (per replica) are scored.
        gather_batch: ``fn(per-example tensor) -> the global batch's``, applied to
            each of `example_statistics` before the reduction (TensorFlow's
            replicas), or ``None``: the batch is whole.
    """
    query, key = call.query[:examples], call.key[:examples]
    scores = attention_scores(query, key, call.scale, call.soft_cap)
    per_example = example_statistics(scores, call.allowed(query, key, examples))
    if gather_batch is not None:
        per_example = [gather_batch(value) for value in per_example]
    return (call.name, *head_statistics(*per_example))
