"""tests/test_spike_rule_beyond_squares.py, run on JAX (JAX's `judge`)."""

from test_spike_rule_beyond_squares import (  # noqa: F401 (collected here, in the JAX run)
    test_a_norm_beyond_the_squares_with_finite_elements_spikes_with_an_infinite_score,
    test_a_norm_within_the_squares_is_judged_as_before,
    test_it_spikes_during_the_warm_up_too_but_not_with_a_loss_that_is_not_finite,
    test_it_is_not_a_spike_where_an_element_may_be_non_finite,
)
