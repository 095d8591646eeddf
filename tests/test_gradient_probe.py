"""GradientProbe on plain Keras models: delivery, restoration, errors.

The tests of what holds on both backends are backend-free (Keras and NumPy) and
tests/jax/test_gradient_probe_jax.py runs them on JAX too. Three stay TensorFlow's, as
they look at its probed step itself (its kept step and buffer, ProbeTape's message):
``test_model_behaves_as_before_after_the_probed_fit``,
``test_own_train_step_without_a_probe_tape_is_refused_naming_the_fix`` and
``test_records_taken_from_the_outputs_are_the_records_in_the_buffer``.
"""

import re

import keras
import numpy as np
import pytest

import kgrad
from kgrad.backends.common import attached
from fit_helpers import (
    RecordCollector,
    SubclassedClassifier,
    assert_finite_record,
    classification_data,
    compile_classifier,
    functional_classifier,
    sequential_classifier,
    weights_max_abs_difference,
)

ON_JAX = keras.config.backend() == "jax"

BUILDERS = {
    "sequential": sequential_classifier,
    "functional": functional_classifier,
    "subclassed": SubclassedClassifier,
}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_probes_sequential_functional_and_subclassed_models(kind, tmp_path):
    x, y = classification_data()
    # The subclassed model is not built before fit: it is built inside the step.
    model = compile_classifier(BUILDERS[kind]())
    collector = RecordCollector()
    probe = kgrad.GradientProbe(tmp_path, every_n_steps=3, on_probe=collector, statistics="all")
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[probe])

    # 4 steps per epoch, 8 in all: steps 0, 3 and 6 are probed, each once.
    assert collector.steps == [0, 3, 6]
    assert probe.latest is collector.records[-1]
    record = probe.latest
    assert_finite_record(record)
    for name in ("hidden", "out"):
        assert f"activation_norm/{name}" in record.scalars
        assert f"grad_norm/{name}" in record.scalars
    for weight in model.trainable_weights:
        # Weight tags use the weight's path without the model's own name.
        path = weight.path.removeprefix(f"{model.name}/")
        assert f"weight_grad_norm/{path}" in record.scalars
        assert f"update_ratio/{path}" in record.scalars
    assert {"pred_grad_norm/output", "input_grad_norm/input", "global/grad_norm"} <= set(record.scalars)
    assert kgrad.read_logs(tmp_path)["kgrad"]["scalars"]["global/grad_norm"].steps.tolist() == [0, 3, 6]


def test_latest_is_plain_python_and_numpy():
    x, y = classification_data(samples=16)
    model = compile_classifier(sequential_classifier())
    probe = kgrad.GradientProbe(layers=["hidden"], every_n_steps=1, bucket_count=4, statistics="all")
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[probe])
    record = probe.latest
    assert isinstance(record, kgrad.ProbeRecord)
    assert isinstance(record.step, int) and record.step == 1
    assert all(isinstance(value, float) for value in record.scalars.values())
    buckets = record.histograms["activation_hist/hidden"]
    assert isinstance(buckets, np.ndarray) and buckets.shape == (4, 3)
    assert buckets[:, 2].sum() == 8 * 8  # batch × units


class _TrainFunctionAtStart(keras.callbacks.Callback):
    """Placed before the probe: sees the train_function fit made for itself."""

    def on_train_begin(self, logs=None):
        self.train_function = self.model.train_function


def test_model_behaves_as_before_after_the_probed_fit(tmp_path):
    x, y = classification_data()
    keras.utils.set_random_seed(1)
    probed = compile_classifier(functional_classifier())
    keras.utils.set_random_seed(1)
    plain = compile_classifier(functional_classifier())
    probe = kgrad.GradientProbe(layers=["hidden"], histograms=False, every_n_steps=2)
    seen = _TrainFunctionAtStart()
    probed.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[seen, probe])
    plain.fit(x, y, batch_size=8, shuffle=False, verbose=0)

    assert "train_step" not in probed.__dict__
    # Only the traced probing step, kept (untracked) for the next fit.
    assert attached.names(probed) == ["kept_step"]
    assert [name for name in probed.__dict__ if "kgrad" in name] == [attached.ATTRIBUTE]
    assert not any("kgrad" in variable.path for variable in probed.variables)
    # The train_function fit made before the probe replaced it is back.
    assert probed.train_function is seen.train_function is not None
    state = probe._step.state
    written, steps_run = int(state.written.numpy()), probe._step.steps_run()

    # A second fit without the callback trains exactly like an unprobed model.
    probed.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    plain.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    assert (int(state.written.numpy()), probe._step.steps_run()) == (written, steps_run)
    assert weights_max_abs_difference(probed, plain) == 0.0
    assert probed.evaluate(x, y, verbose=0) == plain.evaluate(x, y, verbose=0)
    np.testing.assert_array_equal(probed.predict(x, verbose=0), plain.predict(x, verbose=0))

    probed.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), plain.predict(x, verbose=0))


class _OwnTrainStep(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(1, name="dense")
        self.own_steps = 0

    def call(self, inputs):
        return self.dense(inputs)

    def train_step(self, data):
        self.own_steps += 1  # counted while tracing, or per step when eager
        return super().train_step(data)


def test_own_train_step_without_a_probe_tape_is_refused_naming_the_fix(tmp_path):
    model = _OwnTrainStep(name="own_train_step")
    model.compile("sgd", "mse", jit_compile=False)
    x, y = np.ones((4, 3), "float32"), np.ones((4, 1), "float32")
    initial = [w.numpy() for w in model.weights] if model.built else None
    log_dir = tmp_path / "logs" / "run1"
    with pytest.raises(
        ValueError,
        match=r"found no kgrad.ProbeTape in the train_step of model '.*' \(class _OwnTrainStep\)"
        r".*replace `tf.GradientTape\(\)` with `kgrad.ProbeTape\(self\)`",
    ):
        model.fit(x, y, batch_size=2, verbose=0, callbacks=[kgrad.GradientProbe(log_dir)])
    assert "train_step" not in model.__dict__
    assert not (tmp_path / "logs").exists()  # no folder left behind
    assert initial is None or all(
        np.array_equal(a, w.numpy()) for a, w in zip(initial, model.weights)
    )
    traced = model.own_steps  # the refused step was traced, never run
    model.fit(x, y, batch_size=2, verbose=0)
    assert model.own_steps == traced + 1  # Keras' own function, traced once


@pytest.mark.parametrize("every_n_steps", [0, -5, 2.5, "5", True, None])
def test_every_n_steps_must_be_a_positive_int(every_n_steps):
    expected = re.escape(f"`every_n_steps` must be a positive int. Received: every_n_steps={every_n_steps!r}")
    with pytest.raises(ValueError, match=expected):
        kgrad.GradientProbe(every_n_steps=every_n_steps)


@pytest.mark.parametrize(
    "options, error, message",
    [
        (
            {"capture": ["activations", "gradients"]},
            ValueError,
            "unknown kinds ['gradients']. Received: capture=['activations', 'gradients']",
        ),
        ({"capture": "weights"}, TypeError, "Received: capture='weights'"),
        ({"bucket_count": 0}, ValueError, "Received: bucket_count=0"),
        ({"histograms": "yes"}, TypeError, "Received: histograms='yes'"),
        ({"on_probe": 3}, TypeError, "Received: on_probe=3"),
        ({"log_dir": 5}, TypeError, "Received: log_dir=5"),
    ],
    ids=["unknown-capture", "capture-string", "bucket-count", "histograms", "on-probe", "log-dir"],
)
def test_bad_options_name_the_argument_and_the_value(options, error, message):
    with pytest.raises(error, match=re.escape(message)):
        kgrad.GradientProbe(**options)


def _assert_untouched_and_trainable(model, x, y):
    assert "train_step" not in model.__dict__
    assert not [name for name in model.__dict__ if "kgrad" in name]
    model.fit(x, y, batch_size=8, verbose=0)


def test_unknown_layer_name_fails_at_fit_start_and_leaves_the_model_untouched():
    x, y = classification_data(samples=16)
    model = compile_classifier(sequential_classifier())
    probe = kgrad.GradientProbe(layers=["hidden", "nope"])
    with pytest.raises(ValueError, match=r"`layers` names a layer .* does not have: 'nope'") as error:
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[probe])
    assert "'hidden', 'out'" in str(error.value)  # the names that would work
    _assert_untouched_and_trainable(model, x, y)


def test_bad_layer_item_type_is_refused():
    x, y = classification_data(samples=16)
    model = compile_classifier(sequential_classifier())
    with pytest.raises(TypeError, match=r"`layers` items must be layer names.*42.*int"):
        model.fit(x, y, verbose=0, callbacks=[kgrad.GradientProbe(layers=[42])])
    _assert_untouched_and_trainable(model, x, y)


def test_two_probes_in_one_fit_are_refused_and_the_model_restored():
    x, y = classification_data(samples=16)
    model = compile_classifier(sequential_classifier())
    probes = [kgrad.GradientProbe(layers=["hidden"]), kgrad.GradientProbe(layers=["out"])]
    with pytest.raises(ValueError, match=r"already has a GradientProbe attached.*second one"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=probes)
    _assert_untouched_and_trainable(model, x, y)


def test_unwritable_log_dir_is_refused(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    x, y = classification_data(samples=16)
    model = compile_classifier(sequential_classifier())
    with pytest.raises(ValueError, match=re.escape(f"log_dir={str(not_a_dir)!r}")):
        model.fit(x, y, verbose=0, callbacks=[kgrad.GradientProbe(not_a_dir)])
    _assert_untouched_and_trainable(model, x, y)


def test_a_later_probed_fit_starts_a_fresh_schedule():
    x, y = classification_data()
    model = compile_classifier(sequential_classifier())
    first, second = RecordCollector(), RecordCollector()
    for collector in (first, second):
        probe = kgrad.GradientProbe(layers=["hidden"], histograms=False, every_n_steps=3, on_probe=collector)
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[probe])
    # Probed steps count from the start of each fit; the step logged is
    # optimizer.iterations, which goes on counting.
    assert first.steps == [0, 3]
    assert second.steps == [4, 7]


class _BufferReader(keras.callbacks.Callback):
    """After the probe, reads the probe's buffer itself: the record written last."""

    def __init__(self, probe):
        super().__init__()
        self.probe = probe
        self.from_buffer = []
        self.delivered = []

    def on_train_batch_end(self, batch, logs=None):
        state = self.probe._step.state
        records, _ = state.read_since(int(state.written.numpy()) - 1)
        self.from_buffer += records
        self.delivered.append(self.probe.latest)


@pytest.mark.parametrize("with_guard", [False, True])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_records_taken_from_the_outputs_are_the_records_in_the_buffer(with_guard, jit_compile, monkeypatch):
    # A function that probes every step returns its record with its outputs:
    # the probe takes it from there and never calls the buffer's reader.
    buffer_reads = []
    from kgrad.backends.tensorflow.handover.state import ProbeState as probe_state

    read_all = probe_state._read_all
    monkeypatch.setattr(probe_state, "_read_all", lambda self: buffer_reads.append(1) or read_all(self))
    x, y = classification_data()
    model = compile_classifier(sequential_classifier(), jit_compile=jit_compile)
    probe = kgrad.GradientProbe(every_n_steps=1, bucket_count=5)
    reader, seen_logs = _BufferReader(probe), []
    keys = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen_logs.append(set(logs)))
    guard = [kgrad.NonFiniteGuard()] if with_guard else []
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[probe, *guard, reader, keys])
    assert len(buffer_reads) == len(reader.from_buffer) == 8  # the reader's own reads only
    assert [record.step for record in reader.delivered] == list(range(8))
    for got, expected in zip(reader.delivered, reader.from_buffer):
        assert got.step == expected.step and got.scalars == expected.scalars
        assert got.histograms.keys() == expected.histograms.keys()
        for tag in got.histograms:
            np.testing.assert_array_equal(got.histograms[tag], expected.histograms[tag])
    # Keras' logs never see the record.
    assert all(keys == {"loss", "accuracy"} for keys in seen_logs)
    assert set(history.history) == {"loss", "accuracy"}
