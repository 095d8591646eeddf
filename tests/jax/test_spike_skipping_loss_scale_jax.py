"""The tests of tests/test_spike_skipping_loss_scale.py, run on JAX: one set of lines holds both backends.

And one of JAX's own: a step whose scaled gradients overflow does not count their NaN/Inf on
the host (`sentinel.tensor_checks`' ``unchecked``), as it would for a step the guard must locate.
"""

import keras
import pytest

import kgrad
from kgrad.backends.jax.guard import sentinel
from test_spike_skipping import _data
from test_spike_skipping_loss_scale import (  # noqa: F401 (collected here, in the JAX run)
    STEPS_KINDS,
    _Applied,
    _fit,
    spiked,
    test_a_planted_spike_under_loss_scaling_is_skipped_bit_for_bit_with_the_scale,
    test_an_overflowed_step_leaves_the_streak_and_the_window_as_they_were,
    test_overflows_of_the_scale_search_are_no_spikes_and_stay_out_of_the_window,
    test_the_skips_values_are_of_the_unscaled_gradients,
)


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@STEPS_KINDS
def test_an_overflowed_step_counts_nothing_on_the_host(mixed_float16, monkeypatch, own_step):
    counted = []
    count_on_host = sentinel._count_on_host
    monkeypatch.setattr(sentinel, "_count_on_host", lambda *t: counted.append(1) or count_on_host(*t))
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=32, spike_warmup=16)
    applied = _Applied()
    x, y = _data(steps=24, fault=())
    _fit(x, y, guard, states=applied, initial_scale=2.0**30, growth=50, own_step=own_step)
    assert applied.applied.count(False) >= 10 and guard.report is None  # the scale search overflowed
    assert counted == []
