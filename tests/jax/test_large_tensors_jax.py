"""Statistics of a tensor of 2**24 elements on JAX: tests/test_large_tensors.py, run here."""

from test_large_tensors import (  # noqa: F401 (collected here, in the JAX run)
    test_statistics_of_a_tensor_of_2_to_the_24_elements_equal_float64,
)
