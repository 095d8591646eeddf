"""The tests of tests/test_guard_watch.py, run on JAX: one set of lines holds both backends."""

from test_guard_watch import (  # noqa: F401 (collected here, in the JAX run)
    test_inf_from_an_overflowing_exp_with_the_last_finite_norm_of_that_activation,
    test_nan_born_in_the_backward_pass_of_sqrt_at_zero_is_the_gradient_of_the_layer_before,
    test_nan_from_log_of_negative_names_the_middle_layer,
)
