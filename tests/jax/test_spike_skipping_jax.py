"""The tests of tests/test_spike_skipping.py, run on JAX: one set of lines holds both backends."""

from test_spike_skipping import (  # noqa: F401 (collected here, in the JAX run)
    spiked,
    test_a_missing_z_score_says_why,
    test_a_planted_spike_is_skipped_and_only_it,
    test_a_probed_step_is_judged_and_skipped_as_an_unprobed_one,
    test_bad_spike_options_are_named,
    test_max_skips_in_a_row_stop_training_with_a_report,
    test_no_step_is_skipped_in_a_clean_run_of_2000_steps,
    test_the_device_window_is_the_mean_and_sigma_of_the_last_accepted_log_losses,
    test_the_samples_are_of_every_s_th_step_run_whose_update_was_applied,
    test_the_sampled_z_scores_leave_out_what_is_not_finite_and_need_two_samples_and_a_spread,
    test_the_skipped_steps_values_equal_a_hand_reference,
    test_the_state_after_a_skipped_step_is_the_state_before_it_bit_for_bit,
)
from test_spike_skipping_demo import test_no_step_of_the_demos_models_is_skipped  # noqa: F401

