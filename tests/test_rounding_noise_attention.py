"""The rounding-noise rule (kgrad.report.spike_rules) on real attention layers, built from configs.

Softmax is invariant to a constant added to every key's score, so the gradient of an
attention layer's key bias is zero in exact arithmetic: in float64 it is ~1e-17 of the
key kernel's, in float32 ~1e-8. The rule must name the key biases, and only them,
among every trainable weight of Keras' MultiHeadAttention and KerasHub's encoder and
GPT-2 (one step's gradients, computed here with the backend's own autodiff).
"""

import keras
import numpy as np
import pytest

from kgrad.report.spike_rules import ROUNDING_NOISE_RATIO, rounding_noise


def weight_gradient_norms(model, inputs):
    """``{weight path: ‖dJ/dw‖}`` of J = Σ output · a fixed random tensor, by the backend's autodiff."""
    outputs = model(inputs)
    target = np.random.default_rng(1).normal(size=outputs.shape).astype(keras.backend.standardize_dtype(outputs.dtype))
    variables = model.trainable_variables
    if keras.backend.backend() == "jax":
        import jax

        def loss(values):
            mapping = list(zip(variables, values))
            with keras.StatelessScope(state_mapping=mapping):
                return keras.ops.sum(model(inputs, training=False) * target)

        gradients = jax.grad(loss)([variable.value for variable in variables])
    else:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            value = tf.reduce_sum(model(inputs, training=False) * target)
        gradients = [tf.convert_to_tensor(gradient) for gradient in tape.gradient(value, variables)]  # embeddings: sparse
    return {variable.path: float(np.linalg.norm(np.asarray(gradient, np.float64)))
            for variable, gradient in zip(variables, gradients)}


def _attention_model(dtype):
    inputs = keras.Input((6, 16), dtype=dtype)
    outputs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="mha", dtype=dtype)(inputs, inputs)
    return keras.Model(inputs, outputs)


def _tokens():
    return {"token_ids": np.random.default_rng(0).integers(0, 32, size=(4, 8)).astype("int32"),
            "padding_mask": np.ones((4, 8), "int32")}


@pytest.mark.parametrize("dtype, largest", [("float64", 1e-13), ("float32", ROUNDING_NOISE_RATIO)])
def test_a_key_bias_gradient_is_zero_in_exact_arithmetic_and_rounding_in_float32(dtype, largest):
    keras.utils.set_random_seed(0)
    model = _attention_model(dtype)
    norms = weight_gradient_norms(model, np.random.default_rng(0).normal(size=(4, 6, 16)).astype(dtype))
    ratio = norms["mha/key/bias"] / norms["mha/key/kernel"]
    assert 0 <= ratio < largest, ratio
    # The query bias, which is not invariant, is an ordinary size beside its kernel.
    assert norms["mha/query/bias"] / norms["mha/query/kernel"] > 1e-3
    if dtype == "float32":
        assert [weight for weight, _ in rounding_noise(norms)] == ["mha/key/bias"]


def test_kerashub_key_biases_and_only_they_are_rounding_noise():
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    encoder_input = keras.Input((8, 16))
    encoder = keras.Model(encoder_input, keras_hub.layers.TransformerEncoder(
        intermediate_dim=32, num_heads=2, name="encoder")(encoder_input))
    gpt2 = keras_hub.models.GPT2Backbone(vocabulary_size=32, num_layers=2, num_heads=2, hidden_dim=16,
                                         intermediate_dim=32, max_sequence_length=8, dropout=0.0)
    for model, inputs in ((encoder, np.random.default_rng(0).normal(size=(4, 8, 16)).astype("float32")),
                          (gpt2, _tokens())):
        norms = weight_gradient_norms(model, inputs)
        keys = sorted(weight for weight in norms if weight.endswith("/key/bias"))
        assert keys and len(keys) == (1 if model is encoder else 2), sorted(norms)
        assert sorted(weight for weight, _ in rounding_noise(norms)) == keys
