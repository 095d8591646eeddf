"""`NonFiniteGuard(skip_spikes=True)`: a spiking step is skipped inside the step, bit for bit.

Backend-free (Keras and NumPy): tests/jax/test_spike_skipping_jax.py runs the same lines on JAX.
A linear model trained with Adam on 48 batches; the last batch's inputs are scaled ×1000 (a
transient fault). Its gradients are known by hand, so the skipped step's per-weight values are
checked against NumPy.
"""

import keras
import numpy as np
import pytest

import kgrad
from kgrad.plan.spike_rule import (
    MIN_LOG_SIGMA, SpikeRule, judge, sample_every, sample_slots, sampled_z_scores,
)
from kgrad.report.spike_leaders import rank_skip_leaders

BATCH, STEPS, FEATURES = 8, 48, 4
SPIKE = STEPS - 1  # the last step: the state after fit is the state the skip kept
# A window of 32 accepted steps judged from the 16th: the update's values are sampled every
# 2nd step run (not the default 16) into 16 samples (`sample_every`, `sample_slots`).
WINDOW, WARMUP, SAMPLE_EVERY = 32, 16, 2


def _data(steps=STEPS, fault=(SPIKE,), scale=1000.0):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(steps * BATCH, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1)) + 0.1 * rng.normal(size=(steps * BATCH, 1))).astype("float32")
    for step in fault:
        x[step * BATCH : (step + 1) * BATCH] *= scale
    return x, y


class _States(keras.callbacks.Callback):
    """Each step's float32 weights and Adam moments, read after it (and the weights before the fit)."""

    def __init__(self):
        super().__init__()
        self.states = []

    def on_train_begin(self, logs=None):
        kernel, bias = (np.array(w) for w in self.model.get_layer("out").weights)
        self.states.append((kernel, bias, 0.0 * kernel, 0.0 * bias, 0.0 * kernel, 0.0 * bias))

    def on_train_batch_end(self, batch, logs=None):
        if keras.backend.backend() == "jax":
            self.model.jax_state_sync()  # the step's state onto the variables, as a checkpoint does
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)  # loss scaling's
        layer = self.model.get_layer("out")
        indices = [optimizer._get_variable_index(w) for w in layer.weights]
        self.states.append(tuple(np.array(w) for w in layer.weights) + tuple(
            np.array(moments[i]) for moments in (optimizer._momentums, optimizer._velocities) for i in indices
        ))


def _fit(x, y, guard=None, steps=None, states=None, **compile_options):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1, name="out")])
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"], **compile_options)
    steps = len(x) // BATCH if steps is None else steps
    losses = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: losses.append(logs["loss"])
    )
    model.fit(
        x[: steps * BATCH],
        y[: steps * BATCH],
        batch_size=BATCH,
        shuffle=False,
        verbose=0,
        callbacks=([record] if guard is None else [guard, record]) + ([] if states is None else [states]),
    )
    model._kgrad_test_losses = [float(loss) for loss in losses]
    return model


def _state(model):
    return [np.array(v) for v in model.weights + model.optimizer.variables + model.metrics_variables]


@pytest.fixture(scope="module")
def spiked(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("spike")
    guard = kgrad.NonFiniteGuard(
        skip_spikes=True, spike_window=WINDOW, spike_warmup=WARMUP, spike_sample_every=SAMPLE_EVERY,
        log_dir=log_dir,
    )
    x, y = _data()
    states = _States()
    model = _fit(x, y, guard, states=states)
    model._kgrad_test_states = states.states
    return guard, model, x, y, log_dir


def test_a_planted_spike_is_skipped_and_only_it(spiked):
    guard, model, _, _, log_dir = spiked
    assert [s.step for s in guard.skipped_steps] == [SPIKE]
    assert guard.spike_report is None and guard.report is None
    assert int(model.optimizer.iterations) == SPIKE  # the skipped update did not count
    logs = kgrad.read_logs(str(log_dir))["kgrad"]["scalars"]
    skipped = logs["global/step_skipped"]
    assert list(skipped.steps) == list(range(STEPS)) and list(np.flatnonzero(skipped.values)) == [SPIKE]
    score = logs["global/spike_score"]
    assert list(score.steps) == list(range(WARMUP, STEPS))  # judged once the window holds 16 steps
    assert score.values[-1] > 6 and max(score.values[:-1]) < 6
    assert {
        "spike_window_mean/log_loss",
        "spike_window_std/log_grad_norm",
        "skip_grad_norm/out/kernel",
        "skip_update_ratio/out/bias",
        "skip_cos_grad_weight/out/kernel",
        "skip_adam_rms/out/kernel",
        "skip_z_grad_norm/out/kernel",
    } <= set(logs)


def test_the_state_after_a_skipped_step_is_the_state_before_it_bit_for_bit(spiked):
    _, model, x, y, _ = spiked
    before = _fit(x, y, steps=SPIKE)  # the same run, stopped before the spiking batch
    for kept, reference in zip(_state(model), _state(before), strict=True):
        np.testing.assert_array_equal(kept, reference)


def test_the_device_window_is_the_mean_and_sigma_of_the_last_accepted_log_losses(spiked):
    guard, _, _, _, _ = spiked
    averages = np.array(spiked[1]._kgrad_test_losses, np.float64)  # Keras' running mean per batch
    losses = averages * np.arange(1, STEPS + 1) - np.concatenate([[0.0], averages[:-1] * np.arange(1, STEPS)])
    rows = dict(guard._spikes.logs[None].rows)
    for step in range(2, STEPS):
        window = np.log(losses[max(0, step - WINDOW) : step])
        np.testing.assert_allclose(rows[step]["spike_window_mean/log_loss"], window.mean(), atol=1e-3)
        np.testing.assert_allclose(rows[step]["spike_window_std/log_loss"], window.std(ddof=1), rtol=1e-2)
        if step >= WARMUP:  # the score: the NumPy rule on the losses (the gradient norms are not known here)
            z = (np.log(losses[step]) - window.mean()) / max(window.std(ddof=1), MIN_LOG_SIGMA)
            assert rows[step]["global/spike_score"] >= z - 1e-2
    assert "spike_window_mean/log_loss" not in rows[1]  # σ needs two accepted steps: absent, not 0


def test_the_numpy_rule_judges_logarithms_after_its_warmup_with_a_floor_on_sigma():
    rule = SpikeRule(sigmas=6, window=8, warmup=4)
    assert judge([[1.0, 1.0]] * 3, [9.0, 9.0], rule) == (False, None)
    # A flat window: σ is taken as MIN_LOG_SIGMA, so a step 1.2x the others is no spike, 9x is.
    assert judge([[1.0, 1.0]] * 8, [1.2, 1.0], rule) == (False, pytest.approx(np.log(1.2) / MIN_LOG_SIGMA))
    assert judge([[1.0, 1.0]] * 8, [9.0, 1.0], rule)[0]
    spike, score = judge([[1.0, 1.0], [2.0, 1.0]] * 2, [99.0, 1.0], rule)
    logs = np.log([1, 2, 1, 2])
    assert spike and score == pytest.approx((np.log(99.0) - logs.mean()) / logs.std(ddof=1))
    # A loss that is not positive has no logarithm: the loss is not judged, the norm still is.
    assert judge([[-1.0, 1.0], [1.0, 2.0]] * 2, [9.0, 1.0], rule) == (False, pytest.approx(
        (0.0 - np.log([1, 2, 1, 2]).mean()) / np.log([1, 2, 1, 2]).std(ddof=1)))
    assert judge([[1.0, 1.0], [2.0, 1.0]] * 2, [-9.0, 1.0], rule) == (False, pytest.approx(0.0))


def _adam_values(step, kernel, bias, moments, x, y, skipped_before=0):
    """``{value: {weight: float}}`` of step ``step`` by NumPy: a Dense layer's MSE gradients, Adam.

    ``moments``: ``(m kernel, m bias, v kernel, v bias)`` before the step; it is Adam's
    ``step + 1 - skipped_before``-th update (a skipped step is no update).
    """
    xb, yb = (a[step * BATCH : (step + 1) * BATCH].astype(np.float64) for a in (x, y))
    residual = xb @ kernel + bias - yb
    grads = {"out/kernel": 2 * xb.T @ residual / residual.size,
             "out/bias": 2 * residual.sum(0) / residual.size}
    t = step + 1 - skipped_before
    values = {name: {} for name in ("grad_norm", "update_ratio", "cos_grad_weight", "adam_rms")}
    for number, (name, weight) in enumerate((("out/kernel", kernel), ("out/bias", bias))):
        g = grads[name]
        m = 0.9 * np.asarray(moments[number], np.float64) + 0.1 * g
        v = 0.999 * np.asarray(moments[2 + number], np.float64) + 0.001 * g * g
        alpha = 0.01 * np.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        update = alpha * m / (np.sqrt(v) + 1e-7)
        values["grad_norm"][name] = np.linalg.norm(g)
        values["update_ratio"][name] = np.linalg.norm(update) / np.linalg.norm(weight)
        values["cos_grad_weight"][name] = np.sum(g * weight) / (np.linalg.norm(g) * np.linalg.norm(weight))
        values["adam_rms"][name] = np.sqrt(
            np.mean(np.square(g * np.sqrt(1 - 0.999**t) / (np.sqrt(v) + 1e-7)))
        )
    return values


def _hand_reference(model, x, y):
    """The skipped step's values from NumPy, from the state the fit kept (the state before it)."""
    kernel, bias = (np.array(w, np.float64) for w in model.get_layer("out").weights)
    optimizer = model.optimizer
    assert int(optimizer.iterations) == SPIKE
    indices = [optimizer._get_variable_index(w) for w in model.get_layer("out").weights]
    moments = [np.array(m[i]) for m in (optimizer._momentums, optimizer._velocities) for i in indices]
    return _adam_values(SPIKE, kernel, bias, moments, x, y)


def _sampled_z_reference(states, skip_values, x, y, skipped=()):
    """The z-scores of the skip's update ratio, cos(g, w) and adam_rms, from NumPy.

    Against the samples of the steps before the spike, one every `sample_every` steps run
    (steps 0, s, 2s, ..., but for those in ``skipped``, whose update was not applied; the
    last `sample_slots` kept): each sample's update ratio is that of the weights the step
    actually wrote (``states``, read after each step), its cos(g, w) and adam_rms those of its
    gradients and moments, by hand.
    """
    rule = SpikeRule(window=WINDOW, warmup=WARMUP, sample_every=SAMPLE_EVERY)
    steps = [step for step in range(0, SPIKE, sample_every(rule)) if step not in skipped]
    samples = {name: {w: [] for w in ("out/kernel", "out/bias")}
               for name in ("update_ratio", "cos_grad_weight", "adam_rms")}
    for step in steps[-sample_slots(rule):]:
        (kernel, bias, *moments), (new_kernel, new_bias, *_) = states[step], states[step + 1]
        before = sum(1 for skip in skipped if skip < step)
        hand = _adam_values(step, kernel.astype(np.float64), bias.astype(np.float64), moments, x, y, before)
        for name, old, new in (("out/kernel", kernel, new_kernel), ("out/bias", bias, new_bias)):
            old, new = old.astype(np.float64), new.astype(np.float64)
            samples["update_ratio"][name].append(np.linalg.norm(new - old) / np.linalg.norm(old))
            samples["cos_grad_weight"][name].append(hand["cos_grad_weight"][name])
            samples["adam_rms"][name].append(hand["adam_rms"][name])
    return {
        value: {w: (skip_values[value][w] - np.mean(s)) / np.std(s, ddof=1) for w, s in per_weight.items()}
        for value, per_weight in samples.items()
    }


def test_the_skipped_steps_values_equal_a_hand_reference(spiked):
    guard, model, x, y, _ = spiked
    (skipped,) = guard.skipped_steps
    reference = _hand_reference(model, x, y)
    for name, per_weight in reference.items():
        for weight, value in per_weight.items():
            np.testing.assert_allclose(
                skipped.values[name][weight], value, rtol=1e-4, err_msg=f"{name} {weight}"
            )
    assert skipped.z_scores["grad_norm"]["out/kernel"] > 6
    # The others against the weight's samples of the applied update, every 2nd accepted step: of
    # the values checked above (a z near 0 would magnify their float32 rounding 1e3×).
    z_reference = _sampled_z_reference(model._kgrad_test_states, skipped.values, x, y)
    for name, per_weight in z_reference.items():
        for weight, z in per_weight.items():
            np.testing.assert_allclose(
                skipped.z_scores[name][weight], z, rtol=1e-4, err_msg=f"z {name} {weight}"
            )
    assert skipped.absent == {}  # every z-score is there: none says why it is missing


def test_the_samples_are_of_every_s_th_step_run_whose_update_was_applied():
    # A spike on a sample step (step 30, s = 2) gives no sample; the next is step 32, s steps run
    # later, on both backends (counted by accepted steps, the samples after it would be the odd
    # steps 31, 33, ...: the later skip's z-scores then differ from this reference).
    early = 30
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=WINDOW, spike_warmup=WARMUP,
                                 spike_sample_every=SAMPLE_EVERY)
    x, y = _data(fault=(early, SPIKE))
    states = _States()
    _fit(x, y, guard, states=states)
    assert [s.step for s in guard.skipped_steps] == [early, SPIKE]
    skipped = guard.skipped_steps[1]
    z_reference = _sampled_z_reference(states.states, skipped.values, x, y, skipped=(early,))
    for name, per_weight in z_reference.items():
        for weight, z in per_weight.items():
            np.testing.assert_allclose(
                skipped.z_scores[name][weight], z, rtol=1e-4, err_msg=f"z {name} {weight}"
            )


def _probed_fit(x, y, probe_dir, guard=None):
    """`_fit` with a `kgrad.GradientProbe` probing every step (with Adam's values); its scalars."""
    probe = kgrad.GradientProbe(str(probe_dir), every_n_steps=1, histograms=False, overwrite=True,
                                instruments=["optimizer"])
    model = _fit(x, y, guard, states=probe)
    return model, kgrad.read_logs(str(probe_dir))["kgrad"]["scalars"]


def test_a_probed_step_is_judged_and_skipped_as_an_unprobed_one(spiked, tmp_path):
    guard_alone, model_alone, x, y, log_dir = spiked
    guard = kgrad.NonFiniteGuard(
        skip_spikes=True, spike_window=WINDOW, spike_warmup=WARMUP, spike_sample_every=SAMPLE_EVERY,
        log_dir=tmp_path / "guard",
    )
    model, probed = _probed_fit(x, y, tmp_path / "probed", guard)
    # Skipped and named as without the probe (whose values are checked by hand above), and every
    # sample step counted alike: the z-scores against the samples are the same.
    (skipped,), (expected,) = guard.skipped_steps, guard_alone.skipped_steps
    assert skipped.step == expected.step == SPIKE
    leaders = [rank_skip_leaders(s.values, s.z_scores).describe() for s in (skipped, expected)]
    assert leaders[0] == leaders[1] and "out" in leaders[0]
    for kind in ("values", "z_scores"):
        for name, per_weight in getattr(expected, kind).items():
            for weight, value in per_weight.items():
                np.testing.assert_allclose(getattr(skipped, kind)[name][weight], value, rtol=1e-5,
                                           err_msg=f"{kind} {name} {weight}")
    for kept, reference in zip(_state(model), _state(model_alone), strict=True):  # training unchanged
        np.testing.assert_array_equal(kept, reference)
    spike_logs = kgrad.read_logs(str(tmp_path / "guard"))["kgrad"]["scalars"]
    alone_logs = kgrad.read_logs(str(log_dir))["kgrad"]["scalars"]
    assert set(spike_logs) == set(alone_logs) and "global/step_skipped" in spike_logs
    for tag, series in alone_logs.items():
        np.testing.assert_array_equal(spike_logs[tag].steps, series.steps, err_msg=tag)
        np.testing.assert_allclose(spike_logs[tag].values, series.values, rtol=1e-5, err_msg=tag)
    # The probe's records: those of a probe without the guard, but for the skipped step's update,
    # which was not applied: its weights did not move (0, not the update it would have made). Its
    # adam_rms is of the moments the update computed (TensorFlow computes it before the update).
    _, unguarded = _probed_fit(x, y, tmp_path / "unguarded")
    assert set(probed) == set(unguarded) and "adam_rms/out/kernel" in probed
    for tag, series in unguarded.items():
        assert list(probed[tag].steps) == list(series.steps) == list(range(STEPS)), tag
        last = -1 if tag.startswith(("update_ratio/", "update_rms/")) else None
        np.testing.assert_allclose(probed[tag].values[:last], series.values[:last], rtol=1e-6, err_msg=tag)
        if last:
            assert probed[tag].values[-1] == 0 and series.values[-1] > 0, tag


@pytest.mark.parametrize("options", [dict(run_eagerly=True), dict(jit_compile=True)], ids=["eager", "xla"])
def test_the_skip_and_its_values_are_the_same_eagerly_and_under_xla(spiked, options):
    # TensorFlow (the skip's measure is a function call of its own there); JAX jits by default.
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=WINDOW, spike_warmup=WARMUP,
                                 spike_sample_every=SAMPLE_EVERY)
    model = _fit(*spiked[2:4], guard, **options)
    (skipped,), (expected,) = guard.skipped_steps, spiked[0].skipped_steps
    assert skipped.step == expected.step == SPIKE and int(model.optimizer.iterations) == SPIKE
    # Training unchanged, bit for bit: under XLA a sample step (every other step here) applies its
    # update, measures it, undoes it and applies it again (`guard/xla_measure.py`).
    unguarded = _fit(*spiked[2:4], steps=SPIKE, **options)
    for kept, reference in zip(_state(model), _state(unguarded), strict=True):
        np.testing.assert_array_equal(kept, reference)
    for kind in ("values", "z_scores"):  # the z-scores: the samples are taken the same way
        for name, per_weight in getattr(expected, kind).items():
            for weight, value in per_weight.items():
                np.testing.assert_allclose(
                    getattr(skipped, kind)[name][weight], value, rtol=1e-4, err_msg=f"{kind} {name}"
                )


def test_max_skips_in_a_row_stop_training_with_a_report(capsys):
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16, max_skips=3)
    first = 30
    x, y = _data(steps=STEPS, fault=range(first, STEPS))  # a fault that lasts
    model = _fit(x, y, guard)
    assert [s.step for s in guard.skipped_steps] == [first, first + 1, first + 2]
    report = guard.spike_report
    assert report is not None and report.step == first + 2
    assert "3 steps in a row spiked (steps 30, 31, 32)" in str(report)
    assert "stopped training" in capsys.readouterr().err
    assert int(model.optimizer.iterations) == first  # the weights of before the first skip
    reference = _fit(x, y, steps=first)
    for kept, expected in zip(_state(model)[:2], _state(reference)[:2], strict=True):
        np.testing.assert_array_equal(kept, expected)


# The clean runs on which the rule judged on the values themselves (OLMo-core's) false-alarmed:
# normal inputs and a ReLU layer, 44 (21, 4) of 2000 steps at 4 (16, 64) examples a batch on
# TensorFlow; uniform inputs, 1 at 32 a batch on JAX (docs/guard.md, "False alarms").
@pytest.mark.parametrize("inputs, batch", [("normal", 4), ("normal", 16), ("normal", 64), ("uniform", 32)])
def test_no_step_is_skipped_in_a_clean_run_of_2000_steps(inputs, batch):
    rng = np.random.default_rng(11)
    draw = rng.normal if inputs == "normal" else (lambda size: rng.uniform(-2, 2, size=size))
    x = draw(size=(2000 * batch, 8)).astype("float32")
    y = (np.sin(x[:, :1]) + 0.1 * rng.normal(size=(2000 * batch, 1))).astype("float32")
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.Adam(1e-3), "mse", steps_per_execution=20)
    guard = kgrad.NonFiniteGuard(skip_spikes=True)
    model.fit(x, y, batch_size=batch, shuffle=True, verbose=0, callbacks=[guard])
    assert guard.skipped_steps == [] and guard.spike_report is None
    rows = guard._spikes.logs[None].rows
    scores = [r["global/spike_score"] for _, r in rows if "global/spike_score" in r]
    assert len(rows) == 2000 and len(scores) == 2000 - 128 and max(scores) < 6


def test_bad_spike_options_are_named():
    with pytest.raises(ValueError, match="spike_sigmas"):
        kgrad.NonFiniteGuard(skip_spikes=True, spike_sigmas=0)
    with pytest.raises(ValueError, match="spike_warmup"):
        kgrad.NonFiniteGuard(skip_spikes=True, spike_window=8, spike_warmup=9)
    with pytest.raises(TypeError, match="skip_spikes"):
        kgrad.NonFiniteGuard(skip_spikes="yes")
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=rf"spike_sample_every.*Received: spike_sample_every={bad!r}"):
            kgrad.NonFiniteGuard(skip_spikes=True, spike_sample_every=bad)
    # A spike option without skip_spikes would do nothing: said, not ignored.
    for name, value in (("spike_window", 32), ("spike_sample_every", 4), ("max_skips", 5)):
        with pytest.raises(ValueError, match=rf"`{name}={value}` has no effect without skip_spikes=True"):
            kgrad.NonFiniteGuard(**{name: value})
    assert kgrad.NonFiniteGuard(spike_sigmas=6, spike_window=128)._spikes is None  # the defaults


def test_the_default_sampling_is_one_accepted_step_in_half_a_window():
    assert [SpikeRule(window=n).sample_every for n in (128, 16, 3, 2)] == [64, 8, 1, 1]
    assert SpikeRule(window=16, sample_every=1).sample_every == 1


def fit_with_a_fault(callbacks, steps_per_epoch, epochs, fault_step=None, batch=8):
    """A guard skipping spikes (window 8) on a linear model; ``fault_step``'s inputs ×1000 (each epoch)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(steps_per_epoch * batch, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    if fault_step is not None:
        x[fault_step * batch : (fault_step + 1) * batch] *= 1000.0
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(1e-2), "mse")
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=8)
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, callbacks=[*callbacks, guard])
    return guard


def _device_z_scores(samples, count, values):
    """The backend's z-scores of ``values`` against a window of ``samples`` (``count`` written)."""
    if keras.backend.backend() == "jax":
        import jax.numpy as jnp

        from kgrad.backends.jax.guard.spike_samples import z_scores

        return np.array(z_scores(jnp.asarray(samples), jnp.asarray(count), jnp.asarray(values))[0])
    from kgrad.backends.tensorflow.guard.spike_samples import SampleWindow

    window = SampleWindow(SpikeRule(window=len(samples), warmup=2), samples.shape[1])
    window.values.assign(samples)
    window.count.assign(count)
    return np.array(window.z_scores(values)[0])


def test_the_sampled_z_scores_leave_out_what_is_not_finite_and_need_two_samples_and_a_spread():
    rng = np.random.default_rng(1)
    samples = rng.lognormal(size=(4, 3, 3)).astype("float32")
    samples[0, 0, 0], samples[1, 0, 1] = np.inf, np.nan  # a zero bias's first ratio; a NaN
    samples[:, 1, 2] = 0.5  # σ 0
    samples[:, 2, 2] = np.nan  # adam_rms without a second moment
    values = rng.lognormal(size=(3, 3)).astype("float32")
    values[0, 2] = np.nan
    for count in (1, 2, 3, 9):  # before 2 samples; partly filled; wrapped round (all 4 slots)
        expected = sampled_z_scores(samples, count, values)
        assert np.isnan(expected).any() and (count < 2 or np.isfinite(expected).any())
        np.testing.assert_allclose(_device_z_scores(samples, count, values), expected, rtol=1e-5,
                                   equal_nan=True, err_msg=f"count {count}")
    # By hand: the first weight's update ratio over its finite samples of 3 written.
    finite = samples[1:3, 0, 0].astype(np.float64)
    assert sampled_z_scores(samples, 3, values)[0, 0] == pytest.approx(
        (values[0, 0] - finite.mean()) / finite.std(ddof=1))


def test_a_missing_z_score_says_why():
    from kgrad.callbacks.spike_log import skipped_step
    from kgrad.plan.spike_rule import SKIP_COLUMNS

    table = np.ones((2, len(SKIP_COLUMNS)))
    table[:, SKIP_COLUMNS.index("samples")] = 1
    sampled_z = [SKIP_COLUMNS.index(f"z_{name}") for name in ("update_ratio", "cos_grad_weight", "adam_rms")]
    table[:, sampled_z] = np.nan  # as the device leaves them before 2 samples
    few = skipped_step(3, table, ("a/kernel", "a/bias"), None, sample_every=8)
    assert set(few.z_scores) == {"grad_norm"}
    reason = "fewer than 2 samples yet (one every 8 steps, where its update is applied; 1 at this step)"
    assert reason in few.absent["z_update_ratio"]
    table[:, SKIP_COLUMNS.index("samples")] = 16
    table[:, sampled_z[:2]] = 1.0
    table[1, SKIP_COLUMNS.index("z_cos_grad_weight")] = np.nan
    table[:, SKIP_COLUMNS.index("adam_rms")] = np.nan
    spread = skipped_step(3, table, ("a/kernel", "a/bias"), "keeps no second moment (SGD)", sample_every=8)
    assert spread.z_scores["cos_grad_weight"] == {"a/kernel": 1.0} and "adam_rms" not in spread.z_scores
    assert "σ 0, for a/bias" in spread.absent["z_cos_grad_weight"]
    assert "SGD" in spread.absent["z_adam_rms"] and "z_update_ratio" not in spread.absent
