"""The attention instrument's math (`kgrad.backends.common.attention_scores`) against NumPy in float64.

Written once in ``keras.ops``: this file runs on the backend Keras runs on
(``KERAS_BACKEND=jax python -m pytest tests/test_attention_scores.py`` for JAX), eagerly
and compiled (XLA on TensorFlow, ``jax.jit`` on JAX), on tiny tensors.
"""

import keras
import numpy as np
import pytest
from keras import ops

from kgrad.backends.common.attention_scores import attention_scores, example_statistics, head_statistics


def _reference(query, key, scale, soft_cap, allowed):
    """``(max, entropy)`` per head, float64, one row at a time."""
    query, key = query.astype(np.float64), key.astype(np.float64)
    key = np.repeat(key, query.shape[2] // key.shape[2], axis=2)
    scores = np.einsum("btnh,bsnh->bnts", query, key) * scale
    if soft_cap is not None:
        scores = np.tanh(scores / soft_cap) * soft_cap
    allowed = np.broadcast_to(allowed, scores.shape)
    largest, entropy = [], []
    for head in range(scores.shape[1]):
        rows = [(scores[b, head, t][allowed[b, head, t]]) for b in range(scores.shape[0])
                for t in range(scores.shape[2]) if allowed[b, head, t].any()]
        largest.append(max((row.max() for row in rows), default=-np.inf))
        entropies = []
        for row in rows:
            p = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
            entropies.append(-np.sum(p[p > 0] * np.log(p[p > 0])))
        entropy.append(np.mean(entropies) if entropies else np.nan)
    return np.array(largest), np.array(entropy)


def _compiled(function):
    if keras.config.backend() == "jax":
        import jax

        return jax.jit(function, static_argnums=(2, 3))
    import tensorflow as tf

    return lambda *args: tf.function(function, jit_compile=True)(
        *(tf.constant(a) if isinstance(a, np.ndarray) else a for a in args))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("key_heads, soft_cap", [(4, None), (2, 5.0), (1, None)])
def test_max_and_entropy_equal_numpy_with_an_empty_row_and_an_empty_head(key_heads, soft_cap, compiled):
    rng = np.random.default_rng(key_heads)
    query = rng.normal(size=(3, 5, 4, 6)).astype("float32") * 2
    key = rng.normal(size=(3, 7, key_heads, 6)).astype("float32") * 2
    allowed = rng.random((3, 4, 5, 7)) > 0.5
    allowed[:, :, :, 0] = True
    allowed[0, 2, 3] = False  # a query that attends nowhere: left out
    allowed[:, 3] = False  # a head with nothing to measure: -inf and NaN, never 0

    def statistics(query, key, scale, soft_cap, allowed):
        return head_statistics(*example_statistics(attention_scores(query, key, scale, soft_cap), allowed))

    function = _compiled(statistics) if compiled else statistics
    largest, entropy = (ops.convert_to_numpy(value) for value in function(query, key, 0.4, soft_cap, allowed))
    expected_largest, expected_entropy = _reference(query, key, 0.4, soft_cap, allowed)
    np.testing.assert_allclose(largest, expected_largest, rtol=1e-5)
    np.testing.assert_allclose(entropy, expected_entropy, rtol=1e-5)
    assert largest[3] == -np.inf and np.isnan(entropy[3])


def test_no_mask_is_every_key_allowed():
    rng = np.random.default_rng(0)
    query = rng.normal(size=(2, 3, 2, 4)).astype("float32")
    key = rng.normal(size=(2, 4, 2, 4)).astype("float32")
    scores = attention_scores(query, key, 0.5)
    unmasked = [ops.convert_to_numpy(v) for v in head_statistics(*example_statistics(scores, None))]
    expected = _reference(query, key, 0.5, None, np.ones((2, 2, 3, 4), bool))
    np.testing.assert_allclose(unmasked[0], expected[0], rtol=1e-5)
    np.testing.assert_allclose(unmasked[1], expected[1], rtol=1e-5)
