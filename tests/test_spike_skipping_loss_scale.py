"""`NonFiniteGuard(skip_spikes=True)` under a `keras.optimizers.LossScaleOptimizer` (mixed precision).

Backend-free: tests/jax/test_spike_skipping_loss_scale_jax.py runs the same lines on JAX. The
spike rule judges the true loss and gradients (the scale divided out); a step whose scaled
gradients overflow is the optimizer's own to skip: no spike, out of the window, the streak as it was.
The linear model and data of tests/test_spike_skipping.py, so the skip's values have the same
hand reference; with Keras' step and with a model's own (a `kgrad.ProbeTape` on TensorFlow, a
`kgrad.value_and_grad` on JAX) differentiating ``optimizer.scale_loss(loss)``.
"""

import keras
import numpy as np
import pytest

import kgrad
from kgrad.plan.spike_rule import SpikeRule
from test_spike_skipping import (
    BATCH, FEATURES, SAMPLE_EVERY, SPIKE, WARMUP, WINDOW, _adam_values, _data, _sampled_z_reference,
    _state, _States,
)

# The scale doubles after 16 finite steps in a row: the spiking step (47) would double it, and its
# growth counter would restart; the skip keeps both as they were.
GROWTH = 16
CLEAN_STEPS = 300


def _own_step_model():
    """The linear model with a train step of its own that differentiates the scaled loss."""
    inputs = keras.Input((FEATURES,))
    outputs = keras.layers.Dense(1, name="out")(inputs)
    if keras.backend.backend() == "jax":
        from guide_model import GuideModel

        model = GuideModel(inputs, outputs)
        model.scales_loss = True
        return model
    return OwnStepLinear(inputs, outputs, name="own")


class OwnStepLinear(keras.Model):
    """TensorFlow: a `kgrad.ProbeTape` around the scaled loss, as Keras' own step under mixed precision."""

    def train_step(self, data):
        x, y = data
        with kgrad.ProbeTape(self) as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return self.compute_metrics(x, y, y_pred)


def _fit(x, y, guard=None, steps=None, states=None, initial_scale=4.0, growth=GROWTH, own_step=False,
         **compile_options):
    keras.utils.set_random_seed(3)
    if own_step:
        model = _own_step_model()
    else:
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1, name="out")])
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.01), initial_scale=initial_scale, dynamic_growth_steps=growth
    )
    model.compile(optimizer, "mse", metrics=["mae"], **compile_options)
    steps = len(x) // BATCH if steps is None else steps
    callbacks = [c for c in (guard, states) if c is not None]
    model.fit(x[: steps * BATCH], y[: steps * BATCH], batch_size=BATCH, shuffle=False, verbose=0,
              callbacks=callbacks)
    return model


STEPS_KINDS = pytest.mark.parametrize("own_step", [False, True], ids=["keras_step", "own_step"])


@pytest.fixture(scope="module", params=[False, True], ids=["keras_step", "own_step"])
def spiked(request):
    guard = kgrad.NonFiniteGuard(
        skip_spikes=True, spike_window=WINDOW, spike_warmup=WARMUP, spike_sample_every=SAMPLE_EVERY
    )
    x, y = _data()
    states = _States()
    model = _fit(x, y, guard, states=states, own_step=request.param)
    return guard, model, x, y, states.states, request.param


def test_a_planted_spike_under_loss_scaling_is_skipped_bit_for_bit_with_the_scale(spiked):
    guard, model, x, y, _, own_step = spiked
    assert [s.step for s in guard.skipped_steps] == [SPIKE] and guard.report is None
    before = _fit(x, y, steps=SPIKE, own_step=own_step)  # the same run, stopped before the spiking batch
    # An own step's metrics are its own (docs/guard.md): the weights and the optimizer's variables.
    variables = model.weights + model.optimizer.variables + ([] if own_step else model.metrics_variables)
    names = [variable.path for variable in variables]
    assert {"dynamic_scale", "step_counter"} <= {name.split("/")[-1] for name in names}  # compared too
    for name, kept, reference in zip(names, _state(model), _state(before)):  # _state: these first
        np.testing.assert_array_equal(kept, reference, err_msg=name)
    # The scale grew twice (steps 15 and 31); the skipped step would have doubled it again.
    assert float(np.array(model.optimizer.dynamic_scale)) == 16.0
    assert int(model.optimizer.iterations) == SPIKE


def test_the_skips_values_are_of_the_unscaled_gradients(spiked):
    guard, model, x, y, states, _ = spiked
    (skipped,) = guard.skipped_steps
    inner = model.optimizer.inner_optimizer
    weights = model.get_layer("out").weights
    kernel, bias = (np.array(w, np.float64) for w in weights)
    indices = [inner._get_variable_index(w) for w in weights]
    moments = [np.array(m[i]) for m in (inner._momentums, inner._velocities) for i in indices]
    reference = _adam_values(SPIKE, kernel, bias, moments, x, y)
    for name, per_weight in reference.items():
        for weight, value in per_weight.items():
            np.testing.assert_allclose(skipped.values[name][weight], value, rtol=1e-4, err_msg=name + weight)
    for name, per_weight in _sampled_z_reference(states, skipped.values, x, y).items():
        for weight, z in per_weight.items():
            np.testing.assert_allclose(skipped.z_scores[name][weight], z, rtol=1e-4, err_msg=name + weight)
    assert skipped.z_scores["grad_norm"]["out/kernel"] > 6 and skipped.absent == {}


def test_the_skip_under_loss_scaling_is_the_same_under_xla(spiked):
    if keras.backend.backend() == "jax" or spiked[-1]:
        pytest.skip("TensorFlow's XLA step (JAX jits by default), with Keras' step")
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=WINDOW, spike_warmup=WARMUP,
                                 spike_sample_every=SAMPLE_EVERY)
    model = _fit(*spiked[2:4], guard, jit_compile=True)  # the loss scaler's own branch under XLA
    (skipped,), (expected,) = guard.skipped_steps, spiked[0].skipped_steps
    assert skipped.step == SPIKE and float(np.array(model.optimizer.dynamic_scale)) == 16.0
    for kind in ("values", "z_scores"):
        for name, per_weight in getattr(expected, kind).items():
            for weight, value in per_weight.items():
                np.testing.assert_allclose(getattr(skipped, kind)[name][weight], value, rtol=1e-4)


class _Applied(keras.callbacks.Callback):
    """Whether each step's update was applied (the inner optimizer's iterations moved)."""

    def __init__(self):
        super().__init__()
        self.applied, self._last = [], 0

    def on_train_batch_end(self, batch, logs=None):
        if keras.backend.backend() == "jax":
            self.model.jax_state_sync()
        iterations = int(np.array(self.model.optimizer.inner_optimizer.iterations))
        self.applied.append(iterations > self._last)
        self._last = iterations


@STEPS_KINDS
def test_overflows_of_the_scale_search_are_no_spikes_and_stay_out_of_the_window(own_step, monkeypatch):
    # Mixed precision from a scale of 2**30: the float16 gradients overflow until the scale has
    # halved to what they hold, and again after each doubling (every 50 finite steps).
    counted = _host_counts(monkeypatch)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=WINDOW, spike_warmup=WARMUP,
                                     spike_sample_every=1)  # every accepted step a sample of its update
        applied = _Applied()
        x, y = _data(steps=CLEAN_STEPS, fault=())
        model = _fit(x, y, guard, states=applied, initial_scale=2.0**30, growth=50, own_step=own_step)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    overflowed = [step for step, done in enumerate(applied.applied) if not done]
    assert len(overflowed) >= 10 and overflowed[:10] == list(range(10))  # the search, at the start
    assert guard.skipped_steps == [] and guard.report is None and guard.spike_report is None
    (log,) = guard._spikes.logs.values()  # Keras' step's, or the own step's one part
    rows = dict(log.rows)
    assert sorted(rows) == list(range(CLEAN_STEPS))
    assert all(row["global/step_skipped"] == 0 for row in rows.values())  # the guard skipped none
    accepted = np.cumsum([0] + applied.applied)  # accepted steps before each step
    # The window's mean and σ appear with its 2nd accepted step, the score with its 16th: the
    # overflowed steps were not counted.
    with_mean = [step for step in rows if "spike_window_mean/log_loss" in rows[step]]
    scored = [step for step in rows if "global/spike_score" in rows[step]]
    assert with_mean[0] == int(np.argmax(accepted >= 2)) and scored[0] == int(np.argmax(accepted >= WARMUP))
    assert all(np.isfinite(rows[step]["spike_window_mean/log_grad_norm"]) for step in with_mean)
    assert max(rows[step]["global/spike_score"] for step in scored) < 6
    assert int(np.array(model.optimizer.inner_optimizer.iterations)) == CLEAN_STEPS - len(overflowed)
    # An overflowed step's update is none (the optimizer skipped it): no sample of it was taken.
    assert _sample_count(guard) == CLEAN_STEPS - len(overflowed)
    assert counted == []  # nor were the overflowed gradients' NaN/Inf counted on the host


def _host_counts(monkeypatch):
    """A list that JAX's host count of NaN/Inf (`sentinel.non_finite_counts`) appends to when it runs.

    On TensorFlow the counts are computed in a branch that a clean or overflowed step does not take.
    """
    counted = []
    if keras.backend.backend() == "jax":
        from kgrad.backends.jax.guard import sentinel

        count_on_host = sentinel._count_on_host
        monkeypatch.setattr(sentinel, "_count_on_host", lambda *t: counted.append(1) or count_on_host(*t))
    return counted


def _sample_count(guard):
    """How many samples of the applied update the device took (Keras' step)."""
    state = list(guard._step.guard_states().values())[-1]  # the own step's part: its own
    if keras.backend.backend() == "jax":
        if hasattr(state, "_run"):  # a part's `PartSpikes`
            return int(state._run.record.spikes[state._number].sample_count)
        return int(state.record.spikes.sample_count)
    return int(state.spikes.samples.count.numpy())


def test_an_overflowed_step_leaves_the_streak_and_the_window_as_they_were():
    # (spike, overflowed) of each step; a spike's update is skipped, an overflow's applied (the
    # optimizer skips it). Spike, overflow, spike is a streak of 2; an accepted step ends it.
    steps = [(True, False), (False, True), (True, False), (False, False), (True, False)]
    streaks, accepted = _after_steps(SpikeRule(window=4, warmup=2, max_skips=3, row_capacity=8), steps)
    assert streaks == [1, 1, 2, 0, 1] and accepted == [0, 0, 0, 1, 1]


def _after_steps(rule, steps):
    """The backend's streak and accepted count after each ``(spike, overflowed)`` step."""
    values, nan = np.array([0.0, 0.0, 1.0], np.float32), np.full(3, np.nan, np.float32)
    streaks, accepted = [], []
    if keras.backend.backend() == "jax":
        from kgrad.backends.jax.guard import spikes

        record = spikes.initial_record(rule, 1)
        for spike, overflowed in steps:
            judged = (values, np.bool_(spike), np.float32(0.0), nan, nan)
            record = spikes.after_step(record, rule, judged, np.bool_(not spike), np.bool_(overflowed))
            streaks.append(int(record.streak))
            accepted.append(int(record.accepted))
        return streaks, accepted
    import tensorflow as tf
    from kgrad.backends.tensorflow.guard.spikes import SpikeState

    state = SpikeState(rule, 1)
    for spike, overflowed in steps:
        state.after_step(tf.constant(values), tf.constant(spike), 0.0, tf.constant(nan), tf.constant(nan),
                         tf.constant(not spike), tf.constant(overflowed))
        streaks.append(int(state.streak.numpy()))
        accepted.append(int(state.accepted.numpy()))
    return streaks, accepted
