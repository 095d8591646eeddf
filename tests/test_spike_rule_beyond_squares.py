"""The spike rule judges a global gradient norm beyond float32's sum of squares (issue 55).

A norm above ~1.8e19 has float32 squares that overflow, so its logarithm cannot
be taken from the sums the guard keeps. Where every gradient element is finite
(the guard's counts), the loss finite and the warm-up done, the step spikes with
a score of +Inf; where an element is not finite the NaN guard owns the step, and
nothing is judged in the warm-up. TensorFlow's `SpikeState.judge` here, JAX's
`judge` in tests/jax/test_spike_rule_beyond_squares_jax.py.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from kgrad.backends.tensorflow.guard.spikes import SpikeState
from kgrad.plan.spike_rule import MIN_LOG_SIGMA, SpikeRule

#: Two weights whose sums of squares are each finite and add up beyond float32 (3.4e38).
OVERFLOWING = [3e38, 3e38]


def warmed_state():
    state = SpikeState(SpikeRule(window=4, warmup=2, max_skips=99, row_capacity=16), 2)
    for loss in (1.0, 1.1):
        judged = state.judge(tf.constant(loss), tf.constant([0.5, 0.5]), tf.constant(True))
        assert not bool(judged[1])
        state.after_step(*judged, accepted=tf.constant(True))
    return state


def judge(state, loss, squares, gradients_finite):
    finite = None if gradients_finite is None else tf.constant(gradients_finite)
    _, spike, score, _, _ = state.judge(tf.constant(loss), tf.constant(squares, tf.float32), finite)
    return bool(spike), float(score)


def test_a_norm_beyond_the_squares_with_finite_elements_spikes_with_an_infinite_score():
    assert judge(warmed_state(), 1.0, OVERFLOWING, True) == (True, math.inf)


@pytest.mark.parametrize("gradients_finite", [False, None], ids=["an_element_not_finite", "unknown"])
def test_it_is_not_a_spike_where_an_element_may_be_non_finite(gradients_finite):
    spike, score = judge(warmed_state(), 1.0, OVERFLOWING, gradients_finite)
    assert not spike
    assert abs(score) < 6  # the loss alone is judged, and it is ordinary


def test_it_is_not_a_spike_during_the_warm_up_or_with_a_loss_that_is_not_finite():
    fresh = SpikeState(SpikeRule(window=4, warmup=2, max_skips=99, row_capacity=16), 2)
    spike, score = judge(fresh, 1.0, OVERFLOWING, True)
    assert not spike and math.isnan(score)
    assert not judge(warmed_state(), float("nan"), OVERFLOWING, True)[0]


def test_a_norm_within_the_squares_is_judged_as_before():
    spike, score = judge(warmed_state(), 1.0, [1e30, 1e30], True)
    # The window's ln global norm is ln √(0.5 + 0.5) = 0 on both rows: σ 0, taken as MIN_LOG_SIGMA.
    assert spike and score == pytest.approx(np.log(np.sqrt(2e30)) / MIN_LOG_SIGMA, rel=1e-5)
