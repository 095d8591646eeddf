"""``instruments=["attention"]`` on JAX: per attention layer and head, the largest score and the entropy.

The tags, their meaning and the math are TensorFlow's
(`kgrad.backends.tensorflow.summarize.attention`), in ``jax.numpy``: from the q
and k each layer's ``_compute_attention`` received
(`kgrad.backends.jax.capture.attention_calls`), on the first
``attention_examples`` examples, the scores s = scale·q·k (c·tanh(s/c) with a
soft cap), the keys the layer masks left out; ``attention_logit_max/<layer>/head_<h>``
is their max, ``attention_entropy/<layer>/head_<h>`` the mean over the examples and
the query positions that attend somewhere of the softmax's entropy (nats).
"""

import jax.numpy as jnp
from jax.scipy.special import logsumexp


def attention_scores(query, key, scale, soft_cap=None):
    """``[B, N, T, S]`` float32 scores of ``query`` ``[B, T, N, H]`` and ``key`` ``[B, S, K, H]``.

    Example:

    >>> import jax.numpy as jnp
    >>> attention_scores(jnp.ones([1, 1, 2, 4]), jnp.ones([1, 3, 1, 4]), scale=0.5).tolist()
    [[[[2.0, 2.0, 2.0]], [[2.0, 2.0, 2.0]]]]
    """
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
    if key.shape[2] != query.shape[2]:  # grouped queries: query head n reads key head n // (N / K)
        key = jnp.repeat(key, query.shape[2] // key.shape[2], axis=2)
    scores = jnp.einsum("btnh,bsnh->bnts", query, key) * jnp.float32(scale)
    if soft_cap is not None:
        scores = jnp.tanh(scores / jnp.float32(soft_cap)) * jnp.float32(soft_cap)
    return scores


def head_statistics(scores, allowed):
    """``(attention_logit_max, attention_entropy)`` per head, ``[N]`` each.

    A head whose sub-batch has no row that attends anywhere gets −inf and NaN
    (nothing to measure; never a zero).

    Example:

    >>> import jax.numpy as jnp
    >>> scores = jnp.array([[[[0.0, 0.0], [3.0, -1.0]]]])  # one example, head, 2 queries
    >>> allowed = jnp.array([[[[True, True], [True, False]]]])
    >>> largest, entropy = head_statistics(scores, allowed)
    >>> largest.tolist(), [round(float(entropy[0]), 4)]  # (log 2 + 0) / 2
    ([3.0], [0.3466])
    """
    allowed = jnp.broadcast_to(jnp.ones((), bool) if allowed is None else allowed, scores.shape)
    masked = jnp.where(allowed, scores, -jnp.inf)
    rows = jnp.any(allowed, axis=-1)  # [B, N, T]: rows that attend somewhere
    # A row with no allowed key has log-sum-exp −inf: replaced, then left out.
    log_sum_exp = jnp.where(rows, logsumexp(jnp.where(rows[..., None], masked, 0.0), axis=-1), 0.0)
    log_probabilities = scores - log_sum_exp[..., None]
    probabilities = jnp.where(allowed, jnp.exp(log_probabilities), 0.0)
    # 0·log 0 = 0: a key with probability 0 adds nothing to the entropy.
    entropy = -jnp.sum(jnp.where(probabilities > 0, log_probabilities * probabilities, 0.0), axis=-1)
    entropy = jnp.where(rows, entropy, 0.0)
    largest = jnp.max(masked, axis=(0, 2, 3))
    return largest, jnp.sum(entropy, axis=(0, 2)) / jnp.sum(rows.astype(jnp.float32), axis=(0, 2))


def call_statistics(call, examples):
    """``(name, attention_logit_max [N], attention_entropy [N])`` of one `AttentionCall`."""
    query, key = call.query[:examples], call.key[:examples]
    scores = attention_scores(query, key, call.scale, call.soft_cap)
    return (call.name, *head_statistics(scores, call.mask_of(query, key, examples)))
