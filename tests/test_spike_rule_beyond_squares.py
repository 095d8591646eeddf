"""The spike rule judges a global gradient norm beyond float32's sum of squares (issue 55).

A norm above ~1.8e19 has float32 squares that overflow, so its logarithm cannot
be taken from the sums the guard keeps. Where every gradient element is finite
(the guard's counts) and the loss finite, the step spikes with a score of +Inf,
in the warm-up too (no window is needed to call it one); where an element is not
finite the NaN guard owns the step. The backend's own rule: TensorFlow's
`SpikeState.judge` here, JAX's `judge` under ``KERAS_BACKEND=jax``
(tests/jax/test_spike_rule_beyond_squares_jax.py).
"""

import math

import keras
import numpy as np
import pytest

from kgrad.plan.spike_rule import MIN_LOG_SIGMA, SpikeRule

RULE = SpikeRule(window=4, warmup=2, max_skips=99, row_capacity=16)
#: Two weights whose sums of squares are each finite and add up beyond float32 (3.4e38).
OVERFLOWING = [3e38, 3e38]


class _TensorFlowRule:
    def __init__(self):
        from kgrad.backends.tensorflow.guard.spikes import SpikeState

        self.state = SpikeState(RULE, 2)

    def judge(self, loss, squares, gradients_finite):
        import tensorflow as tf

        finite = None if gradients_finite is None else tf.constant(gradients_finite)
        return self.state.judge(tf.constant(loss), tf.constant(squares, tf.float32), finite)

    def accept(self, judged):
        import tensorflow as tf

        self.state.after_step(*judged, accepted=tf.constant(True))


class _JaxRule:
    def __init__(self):
        from kgrad.backends.jax.guard.spikes import initial_record

        self.record = initial_record(RULE, 2)

    def judge(self, loss, squares, gradients_finite):
        import jax.numpy as jnp

        from kgrad.backends.jax.guard.spikes import judge

        finite = None if gradients_finite is None else jnp.asarray(gradients_finite)
        return judge(self.record, RULE, jnp.float32(loss), jnp.array(squares, jnp.float32), finite)

    def accept(self, judged):
        import jax.numpy as jnp

        from kgrad.backends.jax.guard.spikes import after_step

        self.record = after_step(self.record, RULE, judged, accepted=jnp.asarray(True))


def fresh_rule():
    return _JaxRule() if keras.backend.backend() == "jax" else _TensorFlowRule()


def warmed_rule():
    rule = fresh_rule()
    for loss in (1.0, 1.1):
        judged = rule.judge(loss, [0.5, 0.5], True)
        assert not bool(judged[1])
        rule.accept(judged)
    return rule


def judge(rule, loss, squares, gradients_finite):
    _, spike, score, _, _ = rule.judge(loss, squares, gradients_finite)
    return bool(spike), float(score)


def test_a_norm_beyond_the_squares_with_finite_elements_spikes_with_an_infinite_score():
    assert judge(warmed_rule(), 1.0, OVERFLOWING, True) == (True, math.inf)


@pytest.mark.parametrize("gradients_finite", [False, None], ids=["an_element_not_finite", "unknown"])
def test_it_is_not_a_spike_where_an_element_may_be_non_finite(gradients_finite):
    spike, score = judge(warmed_rule(), 1.0, OVERFLOWING, gradients_finite)
    assert not spike
    assert abs(score) < 6  # the loss alone is judged, and it is ordinary


def test_it_spikes_during_the_warm_up_too_but_not_with_a_loss_that_is_not_finite():
    assert judge(fresh_rule(), 1.0, OVERFLOWING, True) == (True, math.inf)
    spike, score = judge(fresh_rule(), 1.0, [0.5, 0.5], True)
    assert not spike and math.isnan(score)  # an ordinary step in the warm-up: not judged
    assert not judge(warmed_rule(), float("nan"), OVERFLOWING, True)[0]


def test_a_norm_within_the_squares_is_judged_as_before():
    spike, score = judge(warmed_rule(), 1.0, [1e30, 1e30], True)
    # The window's ln global norm is ln √(0.5 + 0.5) = 0 on both rows: σ 0, taken as MIN_LOG_SIGMA.
    assert spike and score == pytest.approx(np.log(np.sqrt(2e30)) / MIN_LOG_SIGMA, rel=1e-5)
