"""The tests of tests/test_spike_skipping_loss_scale.py, run on JAX: one set of lines holds both backends."""

from test_spike_skipping_loss_scale import (  # noqa: F401 (collected here, in the JAX run)
    spiked,
    test_a_planted_spike_under_loss_scaling_is_skipped_bit_for_bit_with_the_scale,
    test_an_overflowed_step_leaves_the_streak_and_the_window_as_they_were,
    test_overflows_of_the_scale_search_are_no_spikes_and_stay_out_of_the_window,
    test_the_skips_values_are_of_the_unscaled_gradients,
)
