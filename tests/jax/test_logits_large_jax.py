"""The logits instrument above 88 on JAX (tests/test_logits_large.py: float64 NumPy references)."""

import test_logits_large as on_tensorflow  # tests/ is on the path (tests/jax/conftest.py)


def test_logit_statistics_of_large_logits_are_finite_and_equal_numpy_on_jax():
    on_tensorflow.test_logit_statistics_of_large_logits_are_finite_and_equal_numpy()


def test_a_fit_with_logits_of_several_hundred_logs_them_finite_and_right_on_jax(tmp_path):
    on_tensorflow.test_a_fit_with_logits_of_several_hundred_logs_them_finite_and_right(tmp_path)
