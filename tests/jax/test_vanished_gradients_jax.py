"""Statistics of gradients of ~1e-22 on JAX: tests/test_vanished_gradients.py, run here."""

from test_vanished_gradients import (  # noqa: F401 (collected here, in the JAX run)
    test_norms_and_spreads_of_gradients_of_1e_22_equal_float64,
    test_the_default_probes_norms_of_gradients_of_1e_22_equal_float64,
    test_the_guards_report_bounds_a_last_finite_loss_of_1e_22_and_never_says_0,
)
