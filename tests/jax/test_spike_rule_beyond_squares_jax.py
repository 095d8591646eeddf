"""JAX's spike rule judges a global gradient norm beyond float32's sum of squares, as TensorFlow's does
(tests/test_spike_rule_beyond_squares.py)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from kgrad.backends.jax.guard.spikes import after_step, initial_record, judge
from kgrad.plan.spike_rule import MIN_LOG_SIGMA, SpikeRule

RULE = SpikeRule(window=4, warmup=2, max_skips=99, row_capacity=16)
OVERFLOWING = [3e38, 3e38]  # each finite, their sum beyond float32


def warmed_record():
    record = initial_record(RULE, 2)
    for loss in (1.0, 1.1):
        judged = judge(record, RULE, jnp.float32(loss), jnp.array([0.5, 0.5]), jnp.asarray(True))
        assert not bool(judged[1])
        record = after_step(record, RULE, judged, accepted=jnp.asarray(True))
    return record


def judged(record, loss, squares, gradients_finite):
    finite = None if gradients_finite is None else jnp.asarray(gradients_finite)
    _, spike, score, _, _ = judge(record, RULE, jnp.float32(loss), jnp.array(squares, jnp.float32), finite)
    return bool(spike), float(score)


def test_a_norm_beyond_the_squares_with_finite_elements_spikes_with_an_infinite_score():
    assert judged(warmed_record(), 1.0, OVERFLOWING, True) == (True, math.inf)


@pytest.mark.parametrize("gradients_finite", [False, None], ids=["an_element_not_finite", "unknown"])
def test_it_is_not_a_spike_where_an_element_may_be_non_finite(gradients_finite):
    spike, score = judged(warmed_record(), 1.0, OVERFLOWING, gradients_finite)
    assert not spike
    assert abs(score) < 6


def test_it_is_not_a_spike_during_the_warm_up_or_with_a_loss_that_is_not_finite():
    spike, score = judged(initial_record(RULE, 2), 1.0, OVERFLOWING, True)
    assert not spike and math.isnan(score)
    assert not judged(warmed_record(), float("nan"), OVERFLOWING, True)[0]


def test_a_norm_within_the_squares_is_judged_as_before():
    spike, score = judged(warmed_record(), 1.0, [1e30, 1e30], True)
    # The window's ln global norm is ln √(0.5 + 0.5) = 0 on both rows: σ 0, taken as MIN_LOG_SIGMA.
    assert spike and score == pytest.approx(np.log(np.sqrt(2e30)) / MIN_LOG_SIGMA, rel=1e-5)
