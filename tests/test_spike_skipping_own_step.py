"""`NonFiniteGuard(skip_spikes=True)` on a model's own train_step: each part judged on its own.

Backend-free lines, run on TensorFlow here and on JAX by
tests/jax/test_spike_skipping_own_step_jax.py (its `gan_kit` fixture: the same GAN as a JAX
``train_step`` of two ``kgrad.value_and_grad`` parts). TensorFlow: the GAN of
tests/test_custom_train_step.py (two tapes, two SGD optimizers). The real examples of its last
batch are scaled ×1000: the discriminator's loss and gradients spike, the generator's step (noise
only, through the discriminator of before) does not. The discriminator's update is skipped, bit
for bit, and the generator's is applied.
"""

import keras
import numpy as np
import pytest

import kgrad
from kgrad.plan.spike_rule import SpikeRule, sample_every, sample_slots

STEPS = 24
SPIKE = STEPS - 1  # the last step: the state after fit is the state the skip kept


class _TensorFlowGAN:
    """The GAN (``make(compiled)``: graph or XLA), its data and its hand gradients on TensorFlow."""

    fit_compiled = False  # the module's fit: graph
    reads_when_computed = False  # the skip flag comes back with each step's logs

    @staticmethod
    def make(compiled):
        from test_custom_train_step import _gan

        return _gan("xla" if compiled else "graph")

    @staticmethod
    def data(steps):
        from test_custom_train_step import _gan_data

        return _gan_data(steps=steps)

    @staticmethod
    def d_grads(gan, images, labels):
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = gan.loss_fn(labels, gan.discriminator(images))
        return tape.gradient(loss, gan.discriminator.trainable_weights)

    @staticmethod
    def forbid_other_host_reads(monkeypatch, reading):
        """Any eager read of a kgrad variable raises unless ``reading`` (a list) is non-empty.

        After a skip, the flag that came back may also be a NaN trip: the guard then reads
        its NaN report too (`GuardState.read_report`), as with Keras' step.
        """
        import tensorflow as tf
        from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

        from kgrad.backends.tensorflow.guard.sentinel import GuardState

        original_read, original_report = BaseResourceVariable._read_variable_op, GuardState.read_report

        def read_report(self, *args, **kwargs):
            reading.append(True)
            try:
                return original_report(self, *args, **kwargs)
            finally:
                reading.pop()

        def guarded_read(variable, *args, **kwargs):
            if tf.executing_eagerly() and "kgrad" in variable.name and not reading:
                raise AssertionError(f"Host read of {variable.name} outside a spike read.")
            return original_read(variable, *args, **kwargs)

        monkeypatch.setattr(BaseResourceVariable, "_read_variable_op", guarded_read)
        monkeypatch.setattr(GuardState, "read_report", read_report)

    @staticmethod
    def g_grads(gan, noise):
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = gan.loss_fn(np.zeros((len(noise), 1), "float32"), gan.discriminator(gan.generator(noise)))
        return tape.gradient(loss, gan.generator.trainable_weights)


@pytest.fixture(scope="module")
def gan_kit():
    from test_custom_train_step import BATCH

    _TensorFlowGAN.batch = BATCH
    return _TensorFlowGAN


@pytest.fixture(scope="module")
def gan_fit(tmp_path_factory, gan_kit):
    log_dir = tmp_path_factory.mktemp("gan_spike")
    batch = gan_kit.batch
    real, noise = gan_kit.data(STEPS)
    real[SPIKE * batch :] *= 1000.0  # reals only: the discriminator's part
    gan = gan_kit.make(gan_kit.fit_compiled)
    # Every accepted step a sample (the default is one in 8 for this window).
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16, spike_sample_every=1, log_dir=log_dir)
    weights = _DiscriminatorWeights()
    gan.fit((real, noise), batch_size=batch, shuffle=False, verbose=0, callbacks=[guard, weights])
    gan._kgrad_test_weights = weights.steps
    before = gan_kit.make(gan_kit.fit_compiled)  # the same run, stopped before the spiking batch
    before.fit((real[: SPIKE * batch], noise[: SPIKE * batch]), batch_size=batch, shuffle=False, verbose=0)
    return guard, gan, before, real, noise, log_dir


class _DiscriminatorWeights(keras.callbacks.Callback):
    """The discriminator's weights before the fit and after each step."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_begin(self, logs=None):
        self.steps.append([np.array(w) for w in self.model.discriminator.trainable_weights])

    def on_train_batch_end(self, batch, logs=None):
        if keras.backend.backend() == "jax":
            self.model.jax_state_sync()  # the step's state onto the variables, as a checkpoint does
        self.on_train_begin()


def _state(model, optimizer):
    return [np.array(v) for v in model.weights + optimizer.variables]


def test_the_spiking_part_is_skipped_bit_for_bit_and_the_other_applied(gan_fit, gan_kit):
    guard, gan, before, real, noise, _ = gan_fit
    assert [(s.step, s.part) for s in guard.skipped_steps] == [(SPIKE, "discriminator")]
    assert guard.spike_report is None and guard.report is None
    assert (int(gan.d_optimizer.iterations), int(gan.g_optimizer.iterations)) == (SPIKE, STEPS)
    for kept, reference in zip(_state(gan.discriminator, gan.d_optimizer),
                               _state(before.discriminator, before.d_optimizer), strict=True):
        np.testing.assert_array_equal(kept, reference)
    # The generator's step, by hand: against the discriminator of before (its update was skipped).
    grads = gan_kit.g_grads(before, noise[SPIKE * gan_kit.batch :])
    weights = before.generator.trainable_weights
    for applied, weight, grad in zip(gan.generator.trainable_weights, weights, grads, strict=True):
        expected = np.array(weight) - 0.2 * np.array(grad)  # the generator's SGD(0.2)
        np.testing.assert_allclose(np.array(applied), expected, rtol=1e-5, atol=1e-7)


def test_the_skipped_parts_values_equal_a_hand_reference(gan_fit, gan_kit):
    guard, _, before, real, noise, _ = gan_fit
    (skipped,) = guard.skipped_steps
    batch = gan_kit.batch
    fake = np.array(before.generator(noise[SPIKE * batch :]))
    images = np.concatenate([fake, real[SPIKE * batch :]], axis=0)
    labels = np.concatenate([np.ones((batch, 1)), np.zeros((batch, 1))], axis=0).astype("float32")
    weights = before.discriminator.trainable_weights
    grads = gan_kit.d_grads(before, images, labels)
    for weight, grad in zip(weights, grads, strict=True):
        path = weight.path.removeprefix("discriminator/")
        g, w = np.array(grad, np.float64), np.array(weight, np.float64)
        np.testing.assert_allclose(skipped.values["grad_norm"][path], np.linalg.norm(g), rtol=1e-4)
        # SGD(0.1): the update is -0.1 g.
        np.testing.assert_allclose(skipped.values["update_ratio"][path],
                                   0.1 * np.linalg.norm(g) / np.linalg.norm(w), rtol=1e-4)
    assert skipped.z_scores["grad_norm"]["d_hidden/kernel"] > 6
    # The discriminator's optimizer (SGD) keeps no second moment: said, with its reason.
    assert "adam_rms" not in skipped.values and "SGD" in skipped.absent["adam_rms"]
    assert "z_adam_rms" in skipped.absent and "adam_rms" not in skipped.z_scores
    # The update ratio's and cos(g, w)'s z-scores against the part's samples: from the weights
    # each sampled step wrote (SGD(0.1): its gradient is (old - new) / 0.1).
    rule = SpikeRule(window=16, sample_every=1)
    steps = list(range(0, SPIKE, sample_every(rule)))[-sample_slots(rule):]
    history = gan_fit[1]._kgrad_test_weights
    for number, weight in enumerate(weights):
        path = weight.path.removeprefix("discriminator/")
        old, new = ([np.array(history[step + after][number], np.float64) for step in steps]
                    for after in (0, 1))
        ratios = [np.linalg.norm(n - o) / np.linalg.norm(o) for o, n in zip(old, new)]
        cosines = [np.sum((o - n) * o) / (np.linalg.norm(o - n) * np.linalg.norm(o))
                   for o, n in zip(old, new)]
        for name, samples in (("update_ratio", ratios), ("cos_grad_weight", cosines)):
            z = (skipped.values[name][path] - np.mean(samples)) / np.std(samples, ddof=1)
            np.testing.assert_allclose(skipped.z_scores[name][path], z, rtol=1e-4, err_msg=f"z {name} {path}")


def test_each_part_logs_its_own_rows(gan_fit):
    guard, _, _, _, _, log_dir = gan_fit
    logs = kgrad.read_logs(str(log_dir))
    for part, skipped in (("discriminator", [SPIKE]), ("generator", [])):
        flags = logs[f"kgrad/{part}"]["scalars"]["global/step_skipped"]
        assert list(flags.steps) == list(range(STEPS)) and list(np.flatnonzero(flags.values)) == skipped
    assert "skip_grad_norm/d_hidden/kernel" in logs["kgrad/discriminator"]["scalars"]


def test_a_probed_step_judges_each_part_as_an_unprobed_one(gan_fit, gan_kit, tmp_path):
    guard_alone, gan_alone, _, real, noise, log_dir = gan_fit  # `real`: with the spike planted
    gan = gan_kit.make(gan_kit.fit_compiled)
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16, spike_sample_every=1,
                                 log_dir=tmp_path / "guard")
    probe = kgrad.GradientProbe(str(tmp_path / "probe"), every_n_steps=1, histograms=False, overwrite=True)
    gan.fit((real, noise), batch_size=gan_kit.batch, shuffle=False, verbose=0, callbacks=[guard, probe])
    assert [(s.step, s.part) for s in guard.skipped_steps] == [(SPIKE, "discriminator")]
    for kind in ("values", "z_scores"):  # every step a probed sample step: the samples alike
        for name, per_weight in getattr(guard_alone.skipped_steps[0], kind).items():
            for weight, value in per_weight.items():
                np.testing.assert_allclose(getattr(guard.skipped_steps[0], kind)[name][weight], value,
                                           rtol=1e-5, err_msg=f"{kind} {name} {weight}")
    for model, optimizer in (("discriminator", "d_optimizer"), ("generator", "g_optimizer")):
        kept = _state(getattr(gan, model), getattr(gan, optimizer))
        for value, reference in zip(kept, _state(getattr(gan_alone, model), getattr(gan_alone, optimizer)),
                                    strict=True):
            np.testing.assert_array_equal(value, reference, err_msg=model)  # training unchanged
    logs, alone = kgrad.read_logs(str(tmp_path / "guard")), kgrad.read_logs(str(log_dir))
    for part in ("discriminator", "generator"):
        scalars, expected = logs[f"kgrad/{part}"]["scalars"], alone[f"kgrad/{part}"]["scalars"]
        assert set(scalars) == set(expected)
        for tag, series in expected.items():
            np.testing.assert_array_equal(scalars[tag].steps, series.steps, err_msg=tag)
            np.testing.assert_allclose(scalars[tag].values, series.values, rtol=1e-5, err_msg=tag)
    # The probe logs the skipped part's weights as kept (they did not move), the other's update.
    probed = kgrad.read_logs(str(tmp_path / "probe"))
    ratios = probed["discriminator/kgrad"]["scalars"]["update_ratio/d_hidden/kernel"]
    assert list(ratios.steps) == list(range(STEPS)) and ratios.values[-1] == 0 and min(ratios.values[:-1]) > 0
    assert probed["generator/kgrad"]["scalars"]["update_ratio/g_hidden/kernel"].values[-1] > 0


def test_a_parts_spike_beyond_float32s_squares_is_skipped(gan_kit):
    """Reals ×1e21 on the last batch: the discriminator's gradient norm overflows float32's sum of
    squares, every element finite (tests/test_spike_skipping_overflow.py, for Keras' step)."""
    batch = gan_kit.batch
    real, noise = gan_kit.data(STEPS)
    real[SPIKE * batch :] *= 1e21
    gan = gan_kit.make(gan_kit.fit_compiled)
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16)
    gan.fit((real, noise), batch_size=batch, shuffle=False, verbose=0, callbacks=[guard])
    assert [(s.step, s.part) for s in guard.skipped_steps] == [(SPIKE, "discriminator")]
    assert guard.report is None and guard.spike_report is None
    (skipped,) = guard.skipped_steps
    assert np.hypot.reduce(list(skipped.values["grad_norm"].values())) > 1.9e19  # squares beyond float32
    assert int(gan.d_optimizer.iterations) == SPIKE


@pytest.mark.parametrize("compiled", [False, True], ids=["graph", "xla"])
def test_a_spike_that_lasts_in_one_part_stops_training_naming_the_part(compiled, gan_kit, capsys):
    batch = gan_kit.batch
    real, noise = gan_kit.data(STEPS)
    real[20 * batch :] *= 1000.0
    gan = gan_kit.make(compiled)
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16, max_skips=3)
    gan.fit((real, noise), batch_size=batch, shuffle=False, verbose=0, callbacks=[guard])
    assert [(s.step, s.part) for s in guard.skipped_steps] == [(20, "discriminator"), (21, "discriminator"),
                                                                (22, "discriminator")]
    report = str(guard.spike_report)
    assert "3 steps in a row of part 'discriminator' spiked (steps 20, 21, 22)" in report
    assert "stopped training" in capsys.readouterr().err
    assert int(gan.d_optimizer.iterations) == 20


READS_STEPS, READS_SPIKE = 24, 20  # steps per epoch; the spiking batch, again in the second epoch


def _fit_logging_reads(gan_kit, monkeypatch, spike):
    """Two epochs of the GAN; the callback events, each spike read after the event before it."""
    import keras

    from kgrad.callbacks.spike_skipping import SpikeSkipping

    events, reading = [], []
    original = SpikeSkipping.read

    def read(self, states, optimizer):
        events.append(("read",))
        reading.append(True)
        try:
            return original(self, states, optimizer)
        finally:
            reading.pop()

    class EventLog(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            events.append(("batch_end", self.epoch, batch))

        def on_epoch_end(self, epoch, logs=None):
            events.append(("epoch_end", epoch))

    monkeypatch.setattr(SpikeSkipping, "read", read)
    gan_kit.forbid_other_host_reads(monkeypatch, reading)
    batch = gan_kit.batch
    real, noise = gan_kit.data(READS_STEPS)
    if spike:
        real[READS_SPIKE * batch : (READS_SPIKE + 1) * batch] *= 1000.0
    gan = gan_kit.make(gan_kit.fit_compiled)
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16)
    gan.fit((real, noise), batch_size=batch, epochs=2, shuffle=False, verbose=0,
            callbacks=[EventLog(), guard])
    points, last = [], None
    for event in events:
        if event == ("read",):
            points.append(last)
        else:
            last = event
    return guard, points


def test_a_clean_own_step_reads_its_spike_states_at_each_epochs_end_only(gan_kit, monkeypatch):
    guard, points = _fit_logging_reads(gan_kit, monkeypatch, spike=False)
    assert guard.skipped_steps == []
    assert points == [("epoch_end", 0), ("epoch_end", 1)]


def test_a_skipped_part_is_read_after_its_batch_and_at_each_epochs_end(gan_kit, monkeypatch):
    guard, points = _fit_logging_reads(gan_kit, monkeypatch, spike=True)
    skipped = [(s.step, s.part) for s in guard.skipped_steps]
    # The spiking batch comes back in the second epoch; whether the discriminator of then
    # spikes on it depends on its weights (on TensorFlow it does, on JAX it does not).
    assert skipped[0] == (READS_SPIKE, "discriminator") and set(skipped) <= {
        (READS_SPIKE, "discriminator"), (READS_STEPS + READS_SPIKE, "discriminator")}
    expected = []
    for epoch in range(2):
        if (epoch * READS_STEPS + READS_SPIKE, "discriminator") in skipped:
            expected.append(("batch_end", epoch, READS_SPIKE))
        expected.append(("epoch_end", epoch))
    assert len(points) == len(expected), points
    for point, wanted in zip(points, expected):
        if wanted[0] == "batch_end" and gan_kit.reads_when_computed:
            # JAX's count of skips is read once computed, never waited for: at that
            # batch's end or a later one of the same epoch.
            assert point[:2] == wanted[:2] and point[2] >= READS_SPIKE, points
        else:  # TensorFlow's flag comes back with the step's logs
            assert point == wanted, points
