"""The tests of tests/test_sinks_after_errors.py that fit, run on JAX: one set of lines holds both backends."""

from test_sinks_after_errors import (  # noqa: F401 (collected here, in the JAX run)
    test_a_callback_whose_installation_fails_closes_the_sinks_it_opened,
    test_a_fit_that_raised_has_its_sinks_closed_when_the_callback_fits_again,
)
