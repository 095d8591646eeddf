"""instruments=["optimizer", "logits"] on KerasHub's GPT-2 and Gemma causal LMs, trained with fit.

Built from configs (no download), trained on made-up token ids. The optimizer's
statistics against Adam's state read back after each step and recomputed in
NumPy; the logits' against the model's own logits; training unchanged.
"""

import keras
import numpy as np
import pytest

import kgrad

keras_hub = pytest.importorskip("keras_hub")

RTOL = 1e-4
B, T, V = 4, 6, 20


def _causal_lm(kind, num_layers=2):
    keras.utils.set_random_seed(0)
    if kind == "gpt2":
        backbone = keras_hub.models.GPT2Backbone(vocabulary_size=V, num_layers=num_layers, num_heads=2,
                                                 hidden_dim=32, intermediate_dim=64, max_sequence_length=16,
                                                 dropout=0.0)
        model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    else:
        backbone = keras_hub.models.GemmaBackbone(vocabulary_size=V, num_layers=num_layers, num_query_heads=4,
                                                  num_key_value_heads=2, hidden_dim=16, intermediate_dim=32,
                                                  head_dim=8)
        model = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    return model


def _data(samples=2 * B):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, V, size=(samples, T + 1)).astype("int32")
    padding = np.arange(T)[None, :] < rng.integers(2, T + 1, size=(samples, 1))
    inputs = {"token_ids": ids[:, :-1] * padding, "padding_mask": padding}
    return inputs, ids[:, 1:] * padding, padding.astype("float32")  # the next tokens, padding weighted 0


class _AdamState(keras.callbacks.Callback):
    """Adam's moments, read back before and after every step (host side)."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def _read(self):
        optimizer, weights = self.model.optimizer, self.model.trainable_weights
        if not optimizer.built:  # before the first step: the moments start at zero
            zeros = {w.path: np.zeros(w.shape) for w in weights}
            return {"iterations": 0, "m": zeros, "v": zeros}
        index = optimizer._get_variable_index
        return {
            "iterations": int(optimizer.iterations.numpy()),
            "m": {w.path: optimizer._momentums[index(w)].numpy().astype("float64") for w in weights},
            "v": {w.path: optimizer._velocities[index(w)].numpy().astype("float64") for w in weights},
        }

    def on_train_batch_begin(self, batch, logs=None):
        self.steps.append({"before": self._read()})

    def on_train_batch_end(self, batch, logs=None):
        self.steps[-1]["after"] = self._read()


def _adam_reference(optimizer, before, after, path, sigmas):
    """adam_rms, the outlier fraction and the fraction of entries too close to call, float64.

    From Adam's moments before and after the step. An entry is an outlier when
    |g − m̂| > k·√max(v̂ − m̂², 0); where the two sides differ by less than the
    float32 rounding of the state (on the first step v̂ = m̂² = g², so both
    sides are rounding errors) the entry may fall either way.
    """
    beta_1, beta_2, epsilon = float(optimizer.beta_1), float(optimizer.beta_2), float(optimizer.epsilon)
    t = after["iterations"]
    m0, m, v = before["m"][path], after["m"][path], after["v"][path]
    g = (m - beta_1 * m0) / (1 - beta_1)  # m_t = β1·m_{t-1} + (1 − β1)·g
    rms = np.sqrt(np.mean((g * np.sqrt(1 - beta_2**t) / (np.sqrt(v) + epsilon)) ** 2))
    m_hat, v_hat = m / (1 - beta_1**t), v / (1 - beta_2**t)
    variance = v_hat - m_hat**2
    deviation, bound = np.abs(g - m_hat), sigmas * np.sqrt(np.maximum(variance, 0))
    outliers = np.mean((variance > 0) & (deviation > bound))
    rounding = 1e-5 * (np.abs(g) + np.abs(m_hat) + np.sqrt(v_hat))
    too_close = (np.abs(deviation - bound) <= rounding) | (np.abs(variance) <= rounding**2)
    return rms, outliers, np.mean(too_close)


def _logit_tags(logits):
    """The logit tags of ``logits`` [B, T, V], float64, over every position."""
    z = logits.astype("float64").reshape(-1, logits.shape[-1])
    lse = np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)
    p = np.exp(z - lse[:, None])
    values = {"logit_max": z.max(-1), "logit_lse": lse, "logit_entropy": -np.sum(p * np.log(p), -1),
              "logit_top1_prob": p.max(-1)}
    return {f"{kind}_{stat}/output": reduce(series) for kind, series in values.items()
            for stat, reduce in (("mean", np.mean), ("max", np.max))}


@pytest.mark.parametrize("kind", ["gpt2", "gemma"])
def test_optimizer_and_logit_statistics_of_a_causal_lm(tmp_path, kind):
    model = _causal_lm(kind)
    inputs, targets, weights = _data()
    first = {name: value[:B] for name, value in inputs.items()}
    expected_logits = _logit_tags(keras.ops.convert_to_numpy(model(first)))  # the model's own, step 0
    records, state = [], _AdamState()
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, capture=["weight_gradients"], histograms=False,
                                instruments=["optimizer", "logits"], outlier_sigmas=1.0,
                                on_probe=records.append)
    model.fit(inputs, targets, sample_weight=weights, batch_size=B, shuffle=False, verbose=0,
              callbacks=[probe, state])
    assert [record.step for record in records] == [0, 1]
    for tag, value in expected_logits.items():
        np.testing.assert_allclose(records[0].scalars[tag], value, rtol=RTOL, err_msg=tag)
    paths = {w.path for w in model.trainable_weights}
    checked, decided = 0, []
    for record, step in zip(records, state.steps):
        for tag, value in record.scalars.items():
            if not tag.startswith("adam_rms/"):
                continue
            path = tag.partition("/")[2]
            assert path in paths, tag
            before, after = step["before"], step["after"]
            rms, outliers, too_close = _adam_reference(model.optimizer, before, after, path, 1.0)
            np.testing.assert_allclose(value, rms, rtol=RTOL, err_msg=tag)
            fraction = record.scalars[f"grad_outlier_fraction/{path}"]
            assert abs(fraction - outliers) <= too_close + 1e-7, (tag, record.step, fraction, outliers)
            decided.append(1 - too_close)
            checked += 1
    # Every attention, MLP and embedding matrix of both layers, on both steps.
    assert checked >= 2 * 2 * 6
    assert np.mean(decided) > 0.5, decided  # the outlier test is exercised, not only excused
    logs = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    assert logs["logit_max_mean/output"].steps.tolist() == [0, 1]
    assert logs[f"adam_rms/{path}"].steps.tolist() == [0, 1]


@pytest.mark.parametrize("kind", ["gpt2", "gemma"])
def test_training_a_causal_lm_is_unchanged_by_the_instruments(tmp_path, kind):
    # One transformer layer holds every kind of weight and tap the instruments
    # read (embedding, attention, MLP, norms, head); a second one only doubled
    # the tracing (8.7 -> 5.2 CPU-s for GPT-2's two fits).
    inputs, targets, weights = _data()
    plain = _causal_lm(kind, num_layers=1)
    plain.fit(inputs, targets, sample_weight=weights, batch_size=B, shuffle=False, verbose=0)
    probed = _causal_lm(kind, num_layers=1)
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=1, instruments=["optimizer", "logits", "attention"])
    probed.fit(inputs, targets, sample_weight=weights, batch_size=B, shuffle=False, verbose=0,
               callbacks=[probe])
    assert "attention_entropy/transformer_layer_0/self_attention/head_0" in probe.latest.scalars or (
        "attention_entropy/decoder_block_0/attention/head_0" in probe.latest.scalars
    )
    for before, after in zip(plain.get_weights(), probed.get_weights()):
        np.testing.assert_array_equal(before, after)
