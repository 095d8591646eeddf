"""tests/test_spike_skipping_overflow.py, run on JAX."""

from test_spike_skipping_overflow import (  # noqa: F401 (collected here, in the JAX run)
    test_a_spike_of_gradients_of_1e8_is_skipped,
    test_a_spike_of_gradients_of_1e20_is_skipped_though_its_squares_overflow,
    test_in_the_warm_up_too_and_training_goes_on_as_without_the_batch,
)
