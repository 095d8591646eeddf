"""instruments=["attention"] inside model.fit, against scores computed by hand in NumPy.

Each reference starts from the attention layer's own input (seen by a wrapper
of this test's own around the layer's ``call``, in an eager forward pass with
the weights the probed step starts from) and its weights: q = x·Wq + bq,
k = x·Wk + bk (RoPE applied by hand for Gemma), s = scale·q·k, the masks built
from the token ids and the padding mask. The probed step is the first step of
``fit``, on the same batch.
"""

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import kgrad

keras_hub = pytest.importorskip("keras_hub")

RTOL = 1e-4
T, V = 6, 20


def _layer_inputs(model, layers, inputs):
    """``{id(layer): the first argument of its first call}`` in one eager forward pass."""
    seen = {}

    def recording(layer, call):
        def recorded(*args, **kwargs):
            first = args[0] if args else kwargs.get("query", kwargs.get("x"))
            seen.setdefault(id(layer), np.asarray(first, "float64"))
            return call(*args, **kwargs)
        return recorded

    for layer in layers:
        layer.call = recording(layer, layer.call)
    try:
        model(inputs, training=False)
    finally:
        for layer in layers:
            del layer.__dict__["call"]
    return seen


def _reference(q, k, allowed, scale, soft_cap=None):
    """``(max score, mean entropy)`` per head, float64, from q [B,T,N,H], k [B,S,K,H], allowed [B,T,S]."""
    groups = q.shape[2] // k.shape[2]
    k = np.repeat(k, groups, axis=2)
    scores = np.einsum("btnh,bsnh->bnts", q, k) * scale
    if soft_cap is not None:
        scores = soft_cap * np.tanh(scores / soft_cap)
    allowed = np.broadcast_to(allowed[:, None], scores.shape)
    largest = np.where(allowed, scores, -np.inf).max(axis=(0, 2, 3))
    entropies = [[] for _ in range(q.shape[2])]
    for b, n, t in np.ndindex(scores.shape[:3]):
        keep = allowed[b, n, t]
        if not keep.any():
            continue  # a query that attends nowhere
        z = scores[b, n, t][keep]
        p = np.exp(z - z.max())
        p /= p.sum()
        entropies[n].append(-np.sum(p * np.log(p)))
    return largest, np.array([np.mean(values) for values in entropies])


def _dense(x, dense):
    """An EinsumDense of MultiHeadAttention by hand: x·W (+ b), [B, T, N, H]."""
    out = np.einsum("btd,dnh->btnh", x, dense.kernel.numpy().astype("float64"))
    return out + dense.bias.numpy() if dense.bias is not None else out


def _assert_tags(record, name, expected_max, expected_entropy):
    for head, (largest, entropy) in enumerate(zip(expected_max, expected_entropy)):
        np.testing.assert_allclose(record.scalars[f"attention_logit_max/{name}/head_{head}"], largest,
                                   rtol=RTOL, err_msg=f"{name} head {head}")
        np.testing.assert_allclose(record.scalars[f"attention_entropy/{name}/head_{head}"], entropy,
                                   rtol=RTOL, err_msg=f"{name} head {head}")
    assert f"attention_logit_max/{name}/head_{len(expected_max)}" not in record.scalars


def _tokens(batch, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, V, size=(batch, T)).astype("int32")
    lengths = np.array([T, 3, T, 1, 4, T, 2, 5])[:batch]  # padding at the end of most examples
    padding = np.arange(T)[None, :] < lengths[:, None]
    return ids * padding, padding


def _probe(tmp_path, examples, every_n_steps=100):
    return kgrad.GradientProbe(tmp_path, every_n_steps=every_n_steps, capture=["weight_gradients"],
                               histograms=False, instruments=["attention"], attention_examples=examples)


# -- keras.layers.MultiHeadAttention -------------------------------------------------------


def _mha_model(masking, return_scores=False, jit_compile=False):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((T,), dtype="int32")
    x = keras.layers.Embedding(V, 8, mask_zero=masking == "padding", name="embed")(tokens)
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")
    h = attention(x, x, use_causal_mask=masking == "causal", return_attention_scores=return_scores)
    h = h[0] if return_scores else h
    model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
    model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=jit_compile)
    return model


def _mha_expected(model, ids, padding, masking, examples):
    attention = model.get_layer("mha")
    x = _layer_inputs(model, [attention], ids)[id(attention)][:examples]
    q, k = _dense(x, attention._query_dense), _dense(x, attention._key_dense)
    padding = padding[:examples]
    if masking == "padding":  # Keras' mask of the query and of the value
        allowed = padding[:, :, None] & padding[:, None, :]
    else:
        allowed = np.broadcast_to(np.tril(np.ones((T, T), bool)), (examples, T, T))
    return _reference(q, k, allowed, 1 / np.sqrt(4))


@pytest.mark.parametrize("masking, return_scores, jit_compile", [
    ("padding", False, False),
    ("causal", False, False),
    ("causal", True, False),  # the scores materialized (no dot_product_attention)
    ("padding", False, True),
])
def test_multi_head_attention_scores_equal_numpy(tmp_path, masking, return_scores, jit_compile):
    ids, padding = _tokens(8)
    model = _mha_model(masking, return_scores, jit_compile)
    expected = _mha_expected(model, ids, padding, masking, examples=5)
    # Under XLA, probing every step: the statistics' inputs are computed in the compiled step.
    probe = _probe(tmp_path, examples=5, every_n_steps=1 if jit_compile else 100)
    model.fit(ids, np.ones((8, 1)), batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[probe])
    _assert_tags(probe.latest, "mha", *expected)
    logs = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    assert {tag for tag in logs if tag.startswith("attention_")} == {
        f"attention_{kind}/mha/head_{head}" for kind in ("logit_max", "entropy") for head in (0, 1)
    }
    assert logs["attention_logit_max/mha/head_0"].steps.tolist() == [0]


def test_grouped_query_attention_scores_equal_numpy(tmp_path):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((T,), dtype="int32")
    x = keras.layers.Embedding(V, 8, name="embed")(tokens)
    attention = keras.layers.GroupQueryAttention(head_dim=4, num_query_heads=4, num_key_value_heads=2,
                                                 name="gqa")
    h = attention(x, x, use_causal_mask=True)
    model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
    model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=False)
    ids, _ = _tokens(8)
    x = _layer_inputs(model, [attention], ids)[id(attention)][:4]
    q, k = _dense(x, attention._query_dense), _dense(x, attention._key_dense)  # k: 2 heads for 4
    expected = _reference(q, k, np.broadcast_to(np.tril(np.ones((T, T), bool)), (4, T, T)), 1 / 2)
    probe = _probe(tmp_path, examples=4)
    model.fit(ids, np.ones((8, 1)), batch_size=8, shuffle=False, verbose=0, callbacks=[probe])
    _assert_tags(probe.latest, "gqa", *expected)


def test_the_fused_kernel_and_the_materialized_scores_give_the_same_values(tmp_path):
    ids, _ = _tokens(8)
    values = []
    for return_scores in (False, True):
        probe = _probe(tmp_path / str(return_scores), examples=8)
        model = _mha_model("causal", return_scores)
        model.fit(ids, np.ones((8, 1)), batch_size=8, shuffle=False, verbose=0, callbacks=[probe])
        scalars = probe.latest.scalars
        values.append({tag: value for tag, value in scalars.items() if tag.startswith("attention_")})
    assert values[0].keys() == values[1].keys() and len(values[0]) == 4
    for tag in values[0]:
        np.testing.assert_allclose(values[0][tag], values[1][tag], rtol=1e-5, err_msg=tag)


def test_training_is_unchanged_by_the_attention_instrument(tmp_path):
    ids, _ = _tokens(8)
    plain = _mha_model("padding")
    plain.fit(ids, np.ones((8, 1)), batch_size=4, epochs=2, shuffle=False, verbose=0)
    probed = _mha_model("padding")
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["attention"])
    probed.fit(ids, np.ones((8, 1)), batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[probe])
    for before, after in zip(plain.get_weights(), probed.get_weights()):
        np.testing.assert_array_equal(before, after)


class _OwnStep(keras.Model):
    """A model whose own train_step differentiates with a ProbeTape."""

    def __init__(self):
        super().__init__(name="own_step")
        self.embed = keras.layers.Embedding(V, 8, name="embed")
        self.mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, ids):
        x = self.embed(ids)
        return self.out(keras.ops.mean(self.mha(x, x, use_causal_mask=True), axis=1))

    def train_step(self, data):
        ids, y = data
        with kgrad.ProbeTape(self) as tape:
            loss = keras.ops.mean((self(ids, training=True) - y) ** 2)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return {"loss": loss}


def test_a_probe_tape_in_a_models_own_train_step_scores_its_attention(tmp_path):
    keras.utils.set_random_seed(0)
    model = _OwnStep()
    model.compile(keras.optimizers.Adam(0.01), jit_compile=False)
    ids, _ = _tokens(8)
    x = _layer_inputs(model, [model.mha], ids)[id(model.mha)][:4]
    q, k = _dense(x, model.mha._query_dense), _dense(x, model.mha._key_dense)
    expected = _reference(q, k, np.broadcast_to(np.tril(np.ones((T, T), bool)), (4, T, T)), 1 / 2)
    probe = _probe(tmp_path, examples=4)
    model.fit(ids, np.ones((8, 1)), batch_size=8, shuffle=False, verbose=0, callbacks=[probe])
    _assert_tags(probe.latest, "mha", *expected)


def test_under_mirrored_strategy_each_replica_scores_its_first_examples(tmp_path):
    out = tmp_path / "run.npz"
    script = os.path.join(os.path.dirname(__file__), "scripts", "attention_replicas.py")
    result = subprocess.run([sys.executable, script, str(out)], capture_output=True, text=True, timeout=240,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "done: 2 replicas" in result.stdout
    with np.load(out) as arrays:
        run = {key: arrays[key].astype("float64") for key in arrays.files}
    # The global batch of 8 is split 4 + 4: the first 2 examples of each replica.
    x = run["input"][[0, 1, 4, 5]]
    q = np.einsum("btd,dnh->btnh", x, run["query_kernel"]) + run["query_bias"]
    k = np.einsum("btd,dnh->btnh", x, run["key_kernel"]) + run["key_bias"]
    expected = _reference(q, k, np.broadcast_to(np.tril(np.ones((T, T), bool)), (4, T, T)), 1 / 2)
    for head in range(2):
        for kind, values in zip(("logit_max", "entropy"), expected):
            tag = f"scalar/attention_{kind}/mha/head_{head}"
            np.testing.assert_allclose(run[tag], values[head], rtol=RTOL, err_msg=tag)


# -- KerasHub: GPT-2, BERT, Gemma (built from configs, no download) -------------------------


def test_gpt2_attention_equals_numpy(tmp_path):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=V, num_layers=2, num_heads=2, hidden_dim=32,
                                             intermediate_dim=64, max_sequence_length=16, dropout=0.0)
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    ids, padding = _tokens(8)
    inputs = {"token_ids": ids, "padding_mask": padding}
    layers = [backbone.get_layer(f"transformer_layer_{i}")._self_attention_layer for i in range(2)]
    seen = _layer_inputs(backbone, layers, inputs)
    expected = []  # from the weights before the (probed) first step
    for layer in layers:
        x = seen[id(layer)][:4]
        q, k = _dense(x, layer._query_dense), _dense(x, layer._key_dense)
        allowed = np.tril(np.ones((T, T), bool))[None] & padding[:4, None, :]  # causal, padded keys out
        expected.append(_reference(q, k, allowed, 1 / np.sqrt(16)))
    probe = _probe(tmp_path, examples=4)
    model.fit(inputs, ids, batch_size=8, shuffle=False, verbose=0, callbacks=[probe])
    for i, values in enumerate(expected):
        # By its path, as its weights' tags: not the backbone's name, which Keras numbers.
        _assert_tags(probe.latest, f"transformer_layer_{i}/self_attention", *values)


def test_bert_attention_equals_numpy(tmp_path):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=V, num_layers=2, num_heads=4, hidden_dim=16,
                                             intermediate_dim=32, max_sequence_length=16, dropout=0.0)
    model = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2, preprocessor=None,
                                                dropout=0.0)
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    ids, padding = _tokens(8)
    inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": padding}
    layers = [backbone.get_layer(f"transformer_layer_{i}")._self_attention_layer for i in range(2)]
    seen = _layer_inputs(backbone, layers, inputs)
    expected = []
    for layer in layers:
        x = seen[id(layer)][:3]
        q, k = _dense(x, layer._query_dense), _dense(x, layer._key_dense)
        allowed = np.broadcast_to(padding[:3, None, :], (3, T, T))  # padded keys left out
        expected.append(_reference(q, k, allowed, 1 / np.sqrt(4)))
    probe = _probe(tmp_path, examples=3)
    model.fit(inputs, np.arange(8) % 2, batch_size=8, shuffle=False, verbose=0, callbacks=[probe])
    for i, values in enumerate(expected):
        _assert_tags(probe.latest, f"transformer_layer_{i}/self_attention_layer", *values)


def _rope(x):
    """KerasHub's RotaryEmbedding (max_wavelength 10⁴) in Gemma's layout, by hand: x [B, T, N, H]."""
    half = x.shape[-1] // 2
    inverse_frequencies = 10_000.0 ** (-np.arange(0, 2 * half, 2) / (2 * half))
    angles = np.arange(x.shape[1])[:, None] * inverse_frequencies[None, :]  # [T, H/2]
    cos = np.concatenate([np.cos(angles)] * 2, -1)[None, :, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, -1)[None, :, None, :]
    rotated = x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin
    # Gemma interleaves the two halves: [a0, b0, a1, b1, ...].
    return np.stack([rotated[..., :half], rotated[..., half:]], -1).reshape(x.shape)


def _gemma(soft_cap=None, sliding_window=None):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=V, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=16,
        intermediate_dim=32, head_dim=8, attention_logit_soft_cap=soft_cap,
        use_sliding_window_attention=sliding_window is not None, sliding_window_size=sliding_window or 4096,
    )
    model = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    return backbone, model


@pytest.mark.parametrize("soft_cap, sliding_window, fused", [
    (None, None, False),
    (None, None, True),  # ops.dot_product_attention forced: it never shows the scores
    (2.0, 3, False),  # soft-capped logits, a sliding window on layer 0, queries scaled by hidden/heads
])
def test_gemma_attention_equals_numpy(tmp_path, soft_cap, sliding_window, fused):
    backbone, model = _gemma(soft_cap, sliding_window)
    layers = [backbone.get_layer(f"decoder_block_{i}").attention for i in range(2)]
    for layer in layers:
        if fused:
            layer._use_fused_attention_op = lambda: True
        # KerasHub's decoder block always builds it True; Gemma 2 scales by hidden_dim / heads.
        layer.query_head_dim_normalize = soft_cap is None
    ids, padding = _tokens(8)
    inputs = {"token_ids": ids, "padding_mask": padding}
    seen = _layer_inputs(backbone, layers, inputs)
    expected = []
    for i, layer in enumerate(layers):
        x = seen[id(layer)][:4]
        q = _rope(np.einsum("btd,ndh->btnh", x, layer.query_dense.kernel.numpy().astype("float64")))
        k = _rope(np.einsum("bsd,kdh->bskh", x, layer.key_dense.kernel.numpy().astype("float64")))
        allowed = np.tril(np.ones((T, T), bool))[None] & padding[:4, None, :]
        if sliding_window is not None and i % 2 == 0:  # Gemma slides on every other layer
            allowed = allowed & (np.abs(np.arange(T)[:, None] - np.arange(T)[None, :]) < sliding_window)
        scale = 1 / np.sqrt(8 if soft_cap is None else 16 // 4)  # head_dim, or hidden_dim / heads
        expected.append(_reference(q, k, allowed, scale, soft_cap))
    probe = _probe(tmp_path, examples=4)
    model.fit(inputs, ids, batch_size=8, shuffle=False, verbose=0, callbacks=[probe])
    for i, values in enumerate(expected):
        _assert_tags(probe.latest, f"decoder_block_{i}/attention", *values)


# -- what is not computed, and bad input ---------------------------------------------------


def test_an_attention_layer_kgrad_cannot_score_gets_no_tags_and_a_warning(tmp_path):
    x = keras.Input((T, 4))
    h = keras.layers.AdditiveAttention(name="additive")([x, x])
    model = keras.Model(x, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
    model.compile("adam", "mse", jit_compile=False)
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["attention"])
    message = "no attention statistics for layer 'additive': AdditiveAttention is not a layer kgrad knows"
    with pytest.warns(UserWarning, match=re.escape(message)):
        model.fit(np.ones((4, T, 4)), np.ones((4, 1)), shuffle=False, verbose=0, callbacks=[probe])
    assert not [tag for tag in probe.latest.scalars if tag.startswith("attention_")]


class _OwnScores(keras.layers.MultiHeadAttention):
    """Attention whose scores are its own: kgrad cannot know them from q and k."""

    def _compute_attention(self, query, key, value, attention_mask=None, training=None,
                           return_attention_scores=False, use_causal_mask=False):
        return super()._compute_attention(2.0 * query, key, value, attention_mask, training,
                                           return_attention_scores, use_causal_mask)


def test_a_subclass_with_its_own_attention_math_is_named_and_not_scored(tmp_path):
    x = keras.Input((T, 4))
    h = _OwnScores(num_heads=2, key_dim=2, name="own_scores")(x, x)
    h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2, name="mha")(h, h)
    model = keras.Model(x, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
    model.compile("adam", "mse", jit_compile=False)
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["attention"])
    message = "no attention statistics for layer 'own_scores': _OwnScores computes its attention its own way"
    with pytest.warns(UserWarning, match=re.escape(message)):
        model.fit(np.ones((4, T, 4)), np.ones((4, 1)), verbose=0, callbacks=[probe])
    assert {tag.split("/")[1] for tag in probe.latest.scalars if tag.startswith("attention_")} == {"mha"}


def test_a_model_without_attention_gets_a_warning(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("adam", "mse", jit_compile=False)
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["attention"])
    message = r"instruments=\['attention'\]: model '.*' called no attention layer"
    with pytest.warns(UserWarning, match=message):
        model.fit(np.ones((4, 3)), np.ones((4, 1)), shuffle=False, verbose=0, callbacks=[probe])


@pytest.mark.parametrize("value", [0, -2, 1.5, "4", True])
def test_attention_examples_must_be_a_positive_int(value):
    message = re.escape(
        f"`attention_examples` must be a positive int. Received: attention_examples={value!r}"
    )
    with pytest.raises(ValueError, match=message):
        kgrad.GradientProbe(instruments=["attention"], attention_examples=value)
