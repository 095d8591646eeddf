"""The tests of tests/test_replay_mixed_precision.py, run on JAX."""

from test_replay_mixed_precision import (  # noqa: F401 (collected here, in the JAX run)
    bfloat16_policy,
    test_under_mixed_bfloat16_the_replay_names_the_layer_that_made_the_nan,
)
