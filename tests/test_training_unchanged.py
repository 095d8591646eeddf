"""Probing every step trains exactly like plain ``keras.Model.fit``.

Same seeds, same data, 20 steps: the weights (trainable and not: BatchNorm's
moving statistics too) and the logged metrics of a probed fit equal those of a
plain fit, with ``jit_compile`` off and on. The model has every source of
step-to-step state or randomness the probe could disturb: Dropout,
BatchNorm, an L2 penalty, an Embedding (sparse gradients), two inputs and two
weighted outputs with their own loss metrics, and Adam.
"""

import keras
import numpy as np
import pytest

import kgrad
from fit_helpers import weights_max_abs_difference

SAMPLES, BATCH, EPOCHS = 40, 4, 2  # 20 steps
# Every capture kind, on a few layers and without histograms: XLA compiles
# the probed step in seconds per captured tensor. The reference tests check
# the histograms under XLA.
PROBE_OPTIONS = {"layers": ["embedding", "dropout"], "histograms": False}


def _model(model_class):
    numbers = keras.Input((4,), name="numbers")
    tokens = keras.Input((3,), dtype="int32", name="tokens")
    embedded = keras.layers.Flatten(name="flatten")(keras.layers.Embedding(10, 2, name="embedding")(tokens))
    features = keras.layers.Concatenate(name="concat")([numbers, embedded])
    # No bias before BatchNorm: its gradient is ~0, and Adam would blow the
    # round-off of a differently fused XLA graph up to a full-size update.
    hidden = keras.layers.Dense(
        8, use_bias=False, kernel_regularizer=keras.regularizers.L2(0.01), name="hidden"
    )(features)
    hidden = keras.layers.BatchNormalization(name="norm")(hidden)
    hidden = keras.layers.Activation("relu", name="relu")(hidden)
    hidden = keras.layers.Dropout(0.3, name="dropout")(hidden)
    outputs = {
        "score": keras.layers.Dense(1, name="score")(hidden),
        "label": keras.layers.Dense(3, activation="softmax", name="label")(hidden),
    }
    return model_class({"numbers": numbers, "tokens": tokens}, outputs)


def _data():
    rng = np.random.default_rng(0)
    inputs = {
        "numbers": rng.normal(size=(SAMPLES, 4)).astype("float32"),
        "tokens": rng.integers(0, 10, size=(SAMPLES, 3)).astype("int32"),
    }
    targets = {
        "score": rng.normal(size=(SAMPLES, 1)).astype("float32"),
        "label": rng.integers(0, 3, size=SAMPLES),
    }
    return inputs, targets


def _train(model_class, jit_compile, callbacks=()):
    keras.utils.set_random_seed(42)
    model = _model(model_class)
    if isinstance(model, kgrad.ProbingModel):
        model.configure_probe(every_n_steps=1, **{**PROBE_OPTIONS, "layers": ["norm", "label"]})
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss={"score": "mse", "label": "sparse_categorical_crossentropy"},
        loss_weights={"score": 0.5, "label": 1.0},
        metrics={"label": ["accuracy"]},
        jit_compile=jit_compile,
    )
    inputs, targets = _data()
    keras.utils.set_random_seed(7)  # shuffling and dropout masks
    history = model.fit(
        inputs, targets, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=list(callbacks)
    )
    assert int(model.optimizer.iterations) == 20
    return model, history.history


@pytest.fixture(scope="module", params=[False, True], ids=["graph", "xla"])
def plain(request):
    """The reference: a plain keras.Model fit, and its jit_compile setting."""
    model, history = _train(keras.Model, request.param)
    return model, history, request.param


def _assert_same_training(probed, plain):
    (model, history), (reference, reference_history, _) = probed, plain
    assert weights_max_abs_difference(model, reference) <= 1e-6
    assert sorted(history) == sorted(reference_history)
    for name, values in reference_history.items():
        np.testing.assert_allclose(history[name], values, rtol=1e-6, err_msg=name)


def test_gradient_probe_every_step_leaves_training_unchanged(plain):
    steps = []
    probe = kgrad.GradientProbe(
        every_n_steps=1, on_probe=lambda record: steps.append(record.step), **PROBE_OPTIONS
    )
    probed = _train(keras.Model, plain[2], [probe])
    assert steps == list(range(20))
    _assert_same_training(probed, plain)


def test_probing_model_trains_like_keras_model(plain):
    probed = _train(kgrad.ProbingModel, plain[2])
    assert probed[0].probe_results.step == 19
    _assert_same_training(probed, plain)
