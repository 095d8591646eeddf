"""The tests of tests/test_spike_skipping.py, run on JAX: one set of lines holds both backends."""

import keras
import numpy as np
import pytest

import kgrad

from test_spike_skipping import (  # noqa: F401 (collected here, in the JAX run)
    spiked,
    test_a_planted_spike_is_skipped_and_only_it,
    test_bad_spike_options_are_named,
    test_max_skips_in_a_row_stop_training_with_a_report,
    test_no_step_is_skipped_in_a_clean_run_of_2000_steps,
    test_the_device_window_is_the_mean_and_sigma_of_the_last_accepted_log_losses,
    test_the_skipped_steps_values_equal_a_hand_reference,
    test_the_state_after_a_skipped_step_is_the_state_before_it_bit_for_bit,
)
from test_spike_skipping_demo import test_no_step_of_the_demos_models_is_skipped  # noqa: F401


class _OwnStep(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        return {}


def test_an_own_train_step_is_refused_with_the_reason():
    # TensorFlow judges each kgrad.ProbeTape of an own step (tests/test_spike_skipping_own_step.py).
    model = _OwnStep()
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"own train_step on jax yet .*skip_spikes=False"):
        model.fit(np.zeros((4, 1)), np.zeros((4, 1)), verbose=0,
                  callbacks=[kgrad.NonFiniteGuard(skip_spikes=True)])
