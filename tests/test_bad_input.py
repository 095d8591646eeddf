"""Bad input: a clear error (argument, received value, fix) or documented behaviour.

Where each case of issue 6 is tested (the others live beside the feature):

==========================================  =======================================================
unknown layer name                          test_taps (ProbeTape), test_gradient_probe (fit start)
duplicate layer name                        test_taps (ProbeTape), here (GradientProbe, fit start)
``every_n_steps`` <= 0 or not an int        test_gradient_probe, test_probing_model
``log_dir`` that cannot be written          test_gradient_probe (a file), here (under a file)
integer input, input gradients requested    test_tape (ProbeTape raises), here and test_fit_compat
                                            (GradientProbe: float inputs only, with a warning)
layer with no float output                  test_tape (ProbeTape), here (GradientProbe)
model never built                           test_tape, test_gradient_probe (subclassed), here
                                            (Sequential without Input)
ProbeTape opened on another model           test_tape, here (the model called inside a wrapper)
two probes on one model                     test_gradient_probe, test_non_finite_guard
strategy kgrad does not support             test_distribute
==========================================  =======================================================
"""

import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from kgrad.backends.common import attached
from fit_helpers import classification_data, compile_classifier, sequential_classifier


def _assert_restored(model, kept=False):
    """No probing left on the model; after a fit that ended well, the step kept for the next."""
    assert "train_step" not in model.__dict__
    assert attached.names(model) == (["kept_step"] if kept else [])
    assert [name for name in model.__dict__ if "kgrad" in name] == ([attached.ATTRIBUTE] if kept else [])


def test_duplicate_layer_names_fail_at_fit_start():
    x, y = classification_data(samples=16)
    model = compile_classifier(sequential_classifier())
    probe = kgrad.GradientProbe(layers=["hidden", "out", "hidden"])
    with pytest.raises(
        ValueError,
        match=re.escape("lists layer 'hidden' twice. Received: layers=['hidden', 'out', 'hidden']"),
    ):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[probe])
    _assert_restored(model)


def test_duplicate_given_as_name_and_layer_object():
    model = sequential_classifier()
    with pytest.raises(ValueError, match=r"lists layer 'hidden' twice.*List each layer once"):
        kgrad.ProbeTape(model, layers=["hidden", model.get_layer("hidden")])


def test_log_dir_under_a_regular_file_is_refused_before_training(tmp_path):
    regular_file = tmp_path / "notes.txt"
    regular_file.write_text("not a directory")
    log_dir = regular_file / "logs"
    x, y = classification_data(samples=16)
    model = compile_classifier(sequential_classifier())
    weights = model.get_weights()
    with pytest.raises(
        ValueError,
        match=re.escape(f"`log_dir` cannot be written: log_dir={str(log_dir)!r}")
        + r".*Pass a directory you can write to",
    ):
        model.fit(x, y, verbose=0, callbacks=[kgrad.GradientProbe(log_dir)])
    _assert_restored(model)
    for got, expected in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(got, expected)


def _token_model():
    return keras.Sequential(
        [
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(10, 3, name="tokens"),
            keras.layers.Flatten(name="flat"),
            keras.layers.Dense(1, name="out"),
        ]
    )


def test_integer_inputs_get_no_input_gradient_in_fit():
    # Documented: GradientProbe reports dJ/dx for float inputs only, so that
    # capture="all" works on token models; ProbeTape(watch_inputs=True) raises.
    x = np.random.default_rng(0).integers(0, 10, size=(8, 4)).astype("int32")
    y = np.ones((8, 1), "float32")
    model = _token_model()
    model.compile("sgd", "mse", jit_compile=False)
    probe = kgrad.GradientProbe(capture=["input_gradient", "activation_gradients"], every_n_steps=1)
    # Not silently: one warning names the dtype and where the first float gradient is.
    expected = r"only for float inputs: .*\['int32'\].*grad_norm/<its layer>, e.g. of 'tokens'"
    with pytest.warns(UserWarning, match=expected):
        model.fit(x, y, batch_size=4, verbose=0, callbacks=[probe])
    assert not [tag for tag in probe.latest.scalars if tag.startswith("input_grad")]
    with warnings.catch_warnings():  # without dJ/dx asked for, nothing to say
        warnings.simplefilter("error")
        model.fit(x, y, batch_size=4, verbose=0,
                  callbacks=[kgrad.GradientProbe(capture=["activation_gradients"], every_n_steps=1)])
    # The first float tensor, the embedding's output, has its gradient.
    assert probe.latest.scalars["grad_norm/tokens"] > 0
    with pytest.raises(ValueError, match=r"Received: input dtypes \['int32'\].*layers=\['tokens'\]"):
        with kgrad.ProbeTape(model, watch_inputs=True):
            model(tf.constant(x))


class _ArgMax(keras.layers.Layer):
    def call(self, inputs):
        return keras.ops.argmax(inputs, axis=-1)


def _model_with_an_integer_output():
    inputs = keras.Input((3,), name="features")
    scores = keras.layers.Dense(3, name="scores")(inputs)
    model = keras.Model(inputs, [scores, _ArgMax(name="argmax")(scores)])
    model.compile("sgd", ["mse", None], jit_compile=False)
    return model


def test_layer_with_no_float_output_fails_the_fit_and_restores_the_model():
    model = _model_with_an_integer_output()
    x, y = np.ones((8, 3), "float32"), np.ones((8, 3), "float32")
    probe = kgrad.GradientProbe(layers=["scores", "argmax"])
    with pytest.raises(
        ValueError,
        match=r"asks for layer 'argmax', which produced no floating-point output "
        r"\(output dtypes: \['int(32|64)'\]\).*Received: layers=\['scores', 'argmax'\]\. "
        r"Remove it from `layers`",
    ):
        model.fit(x, [y, np.zeros(8)], batch_size=4, verbose=0, callbacks=[probe])
    # Keras calls no on_train_end when the step fails to trace: kgrad restores itself.
    _assert_restored(model)
    model.fit(x, [y, np.zeros(8)], batch_size=4, verbose=0)
    # The suggested fix works.
    fixed = kgrad.GradientProbe(layers=["scores"], every_n_steps=1)
    model.fit(x, [y, np.zeros(8)], batch_size=4, verbose=0, callbacks=[fixed])
    assert fixed.latest.scalars["grad_norm/scores"] > 0
    _assert_restored(model, kept=True)


def test_sequential_without_input_is_built_by_the_first_probed_step():
    # Never built: no Input, no weights until the first batch. The default
    # selection (layers with weights) is applied once the layers are built.
    model = keras.Sequential(
        [keras.layers.Dense(8, activation="relu", name="hidden"), keras.layers.Dense(3, name="out")]
    )
    assert not model.built
    compile_classifier(model)
    x, y = classification_data(samples=16)
    named = kgrad.GradientProbe(layers=["hidden"], every_n_steps=1)
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[named])
    assert "grad_norm/hidden" in named.latest.scalars

    fresh = keras.Sequential(
        [keras.layers.Dense(8, activation="relu", name="hidden"), keras.layers.Dense(3, name="out")]
    )
    compile_classifier(fresh)
    default = kgrad.GradientProbe(every_n_steps=1)
    fresh.fit(x, y, batch_size=8, verbose=0, callbacks=[default])
    assert {"grad_norm/hidden", "grad_norm/out"} <= set(default.latest.scalars)


def test_probe_tape_on_an_unbuilt_model_works_from_its_first_call():
    model = keras.Sequential([keras.layers.Dense(2, name="hidden"), keras.layers.Dense(1, name="out")])
    with kgrad.ProbeTape(model) as tape:
        loss = tf.reduce_sum(model(tf.ones((3, 4))))
    tape.gradient(loss, model.trainable_variables)
    assert list(tape.probe.gradients) == ["hidden", "out"]


def test_probe_tape_on_a_model_that_is_not_the_one_called():
    # A frequent slip: the tape is opened on the inner model, the wrapper is
    # called, so the inner model *is* called and captured...
    inner = sequential_classifier()
    outer = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(2, name="head")])
    with kgrad.ProbeTape(inner) as tape:
        loss = tf.reduce_sum(outer(tf.ones((2, 4))))
    tape.gradient(loss, outer.trainable_variables)
    assert list(tape.probe.gradients) == ["hidden", "out"]
    # ...but a model that is not called at all is an error naming it.
    other = sequential_classifier()
    with kgrad.ProbeTape(other) as tape:
        loss = tf.reduce_sum(outer(tf.ones((2, 4))))
    with pytest.raises(
        ValueError,
        match=rf"`model` was never called.*Received: model='{other.name}'"
        r".*open the ProbeTape on the model you call",
    ):
        tape.gradient(loss, outer.trainable_variables)


def test_a_probe_and_a_probing_model_are_one_probe():
    # Two probes on one model are refused (test_gradient_probe); a
    # GradientProbe on a ProbingModel is not a second probe: it takes over.
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(3, name="out")(keras.layers.Dense(8, name="hidden")(inputs))
    model = compile_classifier(kgrad.ProbingModel(inputs, outputs))
    x, y = classification_data(samples=16)
    records = []
    probe = kgrad.GradientProbe(every_n_steps=1, on_probe=records.append)
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[probe])
    assert [record.step for record in records] == [0, 1]
