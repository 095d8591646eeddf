"""GradientProbe inside real ``model.fit`` calls, one Keras feature at a time."""

import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from fit_helpers import (
    RecordCollector,
    assert_finite_record,
    classification_data,
    compile_classifier,
    expected_probed_steps,
    functional_classifier,
    regularized_classifier,
    sequential_classifier,
)


def _fit_with_probe(model, x, y=None, probe_options=None, **fit_options):
    collector = RecordCollector()
    probe = kgrad.GradientProbe(on_probe=collector, **(probe_options or {}))
    history = model.fit(x, y, verbose=0, callbacks=[probe, *fit_options.pop("callbacks", [])], **fit_options)
    for record in collector.records:
        assert_finite_record(record)
    return collector, history


@pytest.mark.parametrize(
    "steps_per_execution, jit_compile",
    # XLA with one step per execution is also covered by the training and
    # reference tests; each XLA compilation costs seconds.
    [(1, False), (3, False), (3, True)],
    ids=["1-graph", "3-graph", "3-xla"],
)
def test_steps_per_execution_and_jit_compile(steps_per_execution, jit_compile):
    # 10 steps per epoch: with 3 steps per execution the last one is short,
    # and the probed steps fall at different places in each execution.
    x, y = classification_data(samples=20)
    model = compile_classifier(
        functional_classifier(), jit_compile=jit_compile, steps_per_execution=steps_per_execution
    )
    collector, _ = _fit_with_probe(
        model, x, y, {"layers": ["hidden"], "every_n_steps": 2, "statistics": "all"}, batch_size=2, epochs=2
    )
    # Every probed step of every execution arrives once, with its own step.
    assert collector.steps == expected_probed_steps(20, 2)
    assert int(model.optimizer.iterations) == 20
    assert "activation_hist/hidden" in collector.records[0].histograms


def test_run_eagerly():
    x, y = classification_data(samples=16)
    model = compile_classifier(sequential_classifier(), run_eagerly=True)
    collector, _ = _fit_with_probe(model, x, y, {"every_n_steps": 3}, batch_size=4, epochs=2)
    assert collector.steps == [0, 3, 6]
    assert "grad_norm/hidden" in collector.records[0].scalars


def test_sample_weight_reaches_the_prediction_gradient():
    x, y = classification_data(samples=16)
    sample_weight = np.tile([0.0, 1.0], 8).astype("float32")
    model = compile_classifier(functional_classifier())
    collector, _ = _fit_with_probe(
        model, x, y, {"layers": ["hidden"], "every_n_steps": 1, "statistics": "all"},
        sample_weight=sample_weight,
        batch_size=8, shuffle=False,
    )
    # Half the rows of every batch weigh 0: their dJ/dŷ rows are exactly 0.
    assert [r.scalars["pred_grad_zero_fraction/output"] for r in collector.records] == [0.5, 0.5]


def test_class_weight_reaches_the_prediction_gradient():
    x, y = classification_data(samples=16)
    model = compile_classifier(functional_classifier())
    collector, _ = _fit_with_probe(
        model, x, y, {"layers": ["hidden"], "every_n_steps": 1, "statistics": "all"},
        class_weight={0: 0.0, 1: 1.0, 2: 2.0}, batch_size=8, shuffle=False,
    )
    zero_rows = [np.mean(y[i : i + 8] == 0) for i in (0, 8)]
    assert [r.scalars["pred_grad_zero_fraction/output"] for r in collector.records] == zero_rows


def test_validation_data_does_not_count_as_steps():
    x, y = classification_data(samples=16)
    model = compile_classifier(functional_classifier())
    collector, history = _fit_with_probe(
        model, x, y, {"layers": ["hidden"], "every_n_steps": 3},
        validation_data=classification_data(samples=12, seed=1), batch_size=4, epochs=2,
    )
    assert collector.steps == [0, 3, 6]
    assert {"val_loss", "val_accuracy"} <= set(history.history)


# Keras warns when a dataset of unknown length runs out: that is how it ends an epoch.
@pytest.mark.filterwarnings("ignore:Your input ran out of data")
@pytest.mark.parametrize("cardinality", ["known", "unknown"])
def test_tf_data_input(cardinality):
    # 7 steps per epoch in executions of 2: Keras reports the short last
    # execution of an epoch as a full one (and, for unknown cardinality,
    # does not know the epoch's length); every probed step still arrives once.
    x, y = classification_data(samples=14)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if cardinality == "unknown":
        dataset = dataset.filter(lambda features, label: True)
    dataset = dataset.batch(2)
    model = compile_classifier(sequential_classifier(), steps_per_execution=2)
    collector, _ = _fit_with_probe(
        model, dataset, probe_options={"layers": ["hidden"], "every_n_steps": 3}, epochs=2, shuffle=False
    )
    assert collector.steps == [0, 3, 6, 9, 12]


def _multi_input_multi_output_model():
    numbers = keras.Input((4,), name="numbers")
    scale = keras.Input((1,), name="scale")
    tokens = keras.Input((3,), dtype="int32", name="tokens")
    embedded = keras.layers.Embedding(10, 2, name="embedding")(tokens)
    features = keras.layers.Concatenate(name="concat")(
        [numbers, scale, keras.layers.Flatten(name="flatten")(embedded)]
    )
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(features)
    outputs = {
        "score": keras.layers.Dense(1, name="score")(hidden),
        "label": keras.layers.Dense(3, activation="softmax", name="label")(hidden),
    }
    return keras.Model({"numbers": numbers, "scale": scale, "tokens": tokens}, outputs)


def test_dict_inputs_with_integer_ids_and_multiple_outputs():
    rng = np.random.default_rng(0)
    inputs = {
        "numbers": rng.normal(size=(16, 4)).astype("float32"),
        "scale": rng.normal(size=(16, 1)).astype("float32"),
        "tokens": rng.integers(0, 10, size=(16, 3)).astype("int32"),
    }
    targets = {"score": rng.normal(size=(16, 1)).astype("float32"), "label": rng.integers(0, 3, size=16)}
    model = _multi_input_multi_output_model()
    model.compile(
        optimizer="adam", loss={"score": "mse", "label": "sparse_categorical_crossentropy"},
        jit_compile=False,
    )
    collector, history = _fit_with_probe(
        model, inputs, targets, {"layers": ["embedding", "hidden"], "every_n_steps": 2}, batch_size=4
    )
    assert collector.steps == [0, 2]
    scalars = collector.records[-1].scalars
    # Float inputs get dJ/dx under their own names; integer ids get none.
    assert {"input_grad_norm/numbers", "input_grad_norm/scale"} <= set(scalars)
    assert not [tag for tag in scalars if tag.startswith("input_grad_norm/") and "tokens" in tag]
    # The Embedding gradient is IndexedSlices inside the probing tf.cond.
    assert scalars["weight_grad_norm/embedding/embeddings"] > 0
    assert scalars["grad_norm/embedding"] > 0
    for output in ("score", "label"):
        assert scalars[f"pred_grad_norm/{output}"] > 0
    assert {"score_loss", "label_loss", "loss"} <= set(history.history)


class _StepTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


def test_embedding_under_xla_compiles_once():
    # Regression: the Embedding's IndexedSlices gradient came out of the
    # probing tf.cond with a runtime dense_shape, which XLA needs as a
    # constant: it recompiled the step for every batch of ids (seconds each).
    model = keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(50, 2, name="embedding"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(1, name="out"),
        ]
    )
    model.compile("adam", "mse", jit_compile=True)
    ids = np.arange(48, dtype="int32").reshape(16, 3)  # new ids in every batch
    times = _StepTimes()
    collector, _ = _fit_with_probe(
        model, ids, np.ones((16, 1), "float32"), {"layers": ["embedding"], "histograms": False,
        "every_n_steps": 1}, batch_size=2, shuffle=False, callbacks=[times],
    )
    assert collector.steps == list(range(8))
    assert collector.records[-1].scalars["weight_grad_norm/embedding/embeddings"] > 0
    # The first step compiles; the six after the second cost far less in all.
    assert sum(times.seconds[2:]) < times.seconds[0], times.seconds


def test_dropout_and_batch_normalization():
    x, y = classification_data(samples=16)
    model = compile_classifier(regularized_classifier())
    collector, _ = _fit_with_probe(
        model, x, y, {"layers": ["norm", "relu", "dropout"], "every_n_steps": 1, "statistics": "all"},
        batch_size=8,
    )
    scalars = collector.records[0].scalars
    # Dropout(0.3) zeroes activations on top of the ReLU's zeros: it ran in training mode.
    assert scalars["activation_zero_fraction/dropout"] > scalars["activation_zero_fraction/relu"]
    # BatchNorm normalises with batch statistics in training: mean 0 per unit.
    assert abs(scalars["activation_mean/norm"]) < 1e-5
    # Only the trainable BatchNorm weights (gamma, beta) have gradients.
    assert {"weight_grad_norm/norm/gamma", "weight_grad_norm/norm/beta"} <= set(scalars)
    assert "weight_grad_norm/norm/moving_mean" not in scalars


def test_keras_applications_model():
    model = keras.applications.MobileNet(
        input_shape=(32, 32, 3), alpha=0.25, weights=None, classes=3
    )
    model.compile("sgd", "sparse_categorical_crossentropy", jit_compile=False)
    x = np.random.default_rng(0).normal(size=(4, 32, 32, 3)).astype("float32")
    y = np.array([0, 1, 2, 0])
    # Weight gradients are left out only to keep this test fast: their
    # summaries (one per weight, 83 weights) triple the step's tracing time.
    probe_options = {
        "layers": ["conv1", "conv_pw_13_relu", "conv_preds"],
        "capture": ["activations", "activation_gradients", "prediction_gradient", "input_gradient"],
        "histograms": False,
        "every_n_steps": 1,
    }
    collector, _ = _fit_with_probe(model, x, y, probe_options, batch_size=2)
    assert collector.steps == [0, 1]
    scalars = collector.records[-1].scalars
    for name in probe_options["layers"]:
        assert scalars[f"grad_norm/{name}"] > 0
    assert scalars["input_grad_norm/input"] > 0


def test_with_early_stopping_checkpoint_and_keras_tensorboard(tmp_path):
    x, y = classification_data(samples=16)
    model = compile_classifier(sequential_classifier())
    callbacks = [
        # An impossible improvement threshold: training stops after epoch 2.
        keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=100.0),
        keras.callbacks.ModelCheckpoint(tmp_path / "checkpoint.keras"),
        keras.callbacks.TensorBoard(tmp_path, histogram_freq=1, update_freq="batch"),
    ]
    collector, history = _fit_with_probe(
        model, x, y, {"log_dir": tmp_path, "every_n_steps": 3}, batch_size=4, epochs=5,
        callbacks=callbacks, validation_data=(x, y),
    )
    assert len(history.history["loss"]) == 2
    assert collector.steps == [0, 3, 6]
    assert "train_step" not in model.__dict__
    checkpoint = keras.models.load_model(tmp_path / "checkpoint.keras")
    np.testing.assert_allclose(checkpoint.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    runs = sorted(path.name for path in tmp_path.iterdir() if path.is_dir())
    assert runs == ["kgrad", "train", "validation"]
