"""The tests of tests/test_loss_scale.py, run on JAX: one set of lines holds both backends."""

from test_loss_scale import (  # noqa: F401 (collected here, in the JAX run)
    mixed_float16,
    test_an_optimizers_loss_scale_factor_is_divided_back_out,
    test_no_loss_scale_tags_without_a_loss_scale_optimizer,
    test_reported_gradients_are_unscaled_float32_statistics,
    test_the_guard_under_loss_scaling_checks_the_loss_and_when_strict_the_gradients,
    test_the_guards_last_finite_norm_is_of_the_unscaled_gradient,
    test_steps_skipped_by_the_loss_scaler_are_marked_not_exploding_and_training_is_unchanged,
)
