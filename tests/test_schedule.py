"""The probe's schedule (`kgrad.plan.schedule`) against brute-force loops over step indices."""

import numpy as np
import pytest
import tensorflow as tf

from kgrad.plan.options import ProbeConfig
from kgrad.plan.schedule import ProbeSchedule
from kgrad.backends.tensorflow.differentiate.step_plan import StepPlan


@pytest.mark.parametrize("every_n_steps", [1, 2, 3, 7])
def test_probes_any_and_capacity_match_a_loop_over_the_steps(every_n_steps):
    schedule = ProbeSchedule(every_n_steps)
    probed = [step for step in range(60) if step % every_n_steps == 0]
    for first in range(30):
        for last in range(first, 40):
            expected = any(first <= step <= last for step in probed)
            assert schedule.probes_any(first, last) == expected, (first, last)
    for steps_per_execution in range(1, 20):
        # The most probed steps in any window of that many consecutive steps.
        most = max(sum(first <= step < first + steps_per_execution for step in probed) for first in range(30))
        assert schedule.probed_per_execution(steps_per_execution) == most
        assert schedule.record_capacity(steps_per_execution) == most + 1
        plan = StepPlan(ProbeConfig(every_n_steps=every_n_steps), steps_per_execution=steps_per_execution)
        assert plan.record_capacity == most + 1


def test_probes_on_a_counter_tensor_agrees_with_the_host():
    schedule = ProbeConfig(every_n_steps=3).schedule
    counter = tf.Variable(np.int64(0))
    on_device = []
    for _ in range(10):
        on_device.append(bool(tf.function(lambda: schedule.probes(counter))()))
        counter.assign_add(1)
    assert on_device == [schedule.probes(step) for step in range(10)] == [step % 3 == 0 for step in range(10)]


@pytest.mark.parametrize("every_n_steps", [0, -2, 1.5, True, "3"])
def test_a_bad_every_n_steps_is_refused(every_n_steps):
    with pytest.raises(ValueError, match=r"`every_n_steps` must be a positive int\. Received: every_n_"):
        ProbeSchedule(every_n_steps)
