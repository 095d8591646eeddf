"""The rounding-noise rule on real attention layers, with JAX's gradients (tests/test_rounding_noise_attention.py)."""

import test_rounding_noise_attention as on_tensorflow  # tests/ is on the path (tests/jax/conftest.py)
from kgrad.report.spike_rules import ROUNDING_NOISE_RATIO


def test_a_key_bias_gradient_is_rounding_in_float32_on_jax():
    # float32 only: JAX runs without x64 here (the float64 premise is checked on TensorFlow).
    on_tensorflow.test_a_key_bias_gradient_is_zero_in_exact_arithmetic_and_rounding_in_float32(
        "float32", ROUNDING_NOISE_RATIO)


def test_kerashub_key_biases_and_only_they_are_rounding_noise_on_jax():
    on_tensorflow.test_kerashub_key_biases_and_only_they_are_rounding_noise()
