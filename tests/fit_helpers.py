"""Tiny models and data shared by the ``model.fit`` integration tests of issue 3.

Every model here trains in well under a second on a CPU: a few dozen samples,
a handful of units. ``jit_compile`` is always given explicitly, because Keras'
``"auto"`` turns XLA on even on CPU, and compiling costs seconds.
"""

import keras
import numpy as np

FEATURES = 4
CLASSES = 3


def classification_data(samples=32, seed=0):
    """``(x, y)``: float32 features and int class labels."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=(samples,))
    return x, y


def sequential_classifier():
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(8, activation="relu", name="hidden"),
            keras.layers.Dense(CLASSES, activation="softmax", name="out"),
        ]
    )


def functional_classifier(model_class=keras.Model):
    """``model_class(inputs, outputs)``: keras.Model or kgrad.ProbingModel."""
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="out")(hidden)
    return model_class(inputs, outputs)


class SubclassedClassifier(keras.Model):
    """A subclassed model using Keras' own ``train_step``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu", name="hidden")
        self.out = keras.layers.Dense(CLASSES, activation="softmax", name="out")

    def call(self, inputs):
        return self.out(self.hidden(inputs))


def regularized_classifier(model_class=keras.Model):
    """Dropout, BatchNorm and an L2 penalty: every source of step-to-step state."""
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(
        8, kernel_regularizer=keras.regularizers.L2(0.01), name="hidden"
    )(inputs)
    hidden = keras.layers.BatchNormalization(name="norm")(hidden)
    hidden = keras.layers.Activation("relu", name="relu")(hidden)
    hidden = keras.layers.Dropout(0.3, name="dropout")(hidden)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="out")(hidden)
    return model_class(inputs, outputs)


def compile_classifier(model, jit_compile=False, **kwargs):
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=jit_compile,
        **kwargs,
    )
    return model


class RecordCollector:
    """An ``on_probe`` callable keeping every record it receives, in order."""

    def __init__(self):
        self.records = []

    def __call__(self, record):
        self.records.append(record)

    @property
    def steps(self):
        return [record.step for record in self.records]


def expected_probed_steps(total_steps, every_n_steps):
    """The ``optimizer.iterations`` of the probed steps of a fresh ``fit``."""
    return list(range(0, total_steps, every_n_steps))


def assert_finite_record(record):
    values = np.array(list(record.scalars.values()))
    assert np.all(np.isfinite(values)), record.scalars
    for tag, buckets in record.histograms.items():
        assert np.all(np.isfinite(buckets)), tag


def weights_max_abs_difference(model_a, model_b):
    differences = [
        np.max(np.abs(np.asarray(a) - np.asarray(b)))
        for a, b in zip(model_a.get_weights(), model_b.get_weights())
    ]
    return max(differences)


def sqrt_at_zero_loss(y_true, y_pred):
    """MSE, plus sqrt(ŷ·0) on targets above 100: finite forward, NaN backward there.

    d/dŷ of sqrt(ŷ * 0) is Inf * 0 = NaN on the marked examples only, and it
    reaches every weight gradient: a NaN born in the backward pass of the loss.
    """
    marked = keras.ops.cast(y_true > 100.0, "float32")
    return keras.ops.mean(keras.ops.square(y_true - y_pred) * (1.0 - marked)) + keras.ops.mean(
        keras.ops.sqrt(y_pred * 0.0 + (1.0 - marked))
    )


class SharedDense(keras.Model):
    """A Dense layer called twice: its per-example gradient is the sum of both calls'."""

    def __init__(self):
        super().__init__()
        self.shared = keras.layers.Dense(3, activation="tanh", name="shared")
        self.head = keras.layers.Dense(2, name="head")

    def call(self, x):
        return self.head(self.shared(x[:, :4]) * self.shared(x[:, 4:]))


def guard_data(samples=32, features=3, seed=0):
    """Inputs in [0.5, 1.5) and normal targets: the guard's tests make one batch bad themselves."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 1.5, size=(samples, features)).astype("float32")
    y = rng.normal(size=(samples, 1)).astype("float32")
    return x, y


def middle_model(middle, name="middle"):
    """Dense -> `middle` (a Lambda named `name`) -> Dense, on 3 features."""
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, name="first"),
        keras.layers.Lambda(middle, name=name),
        keras.layers.Dense(1, name="out"),
    ])


def gan_models(d_activation="sigmoid"):
    """``(discriminator, generator)`` of the GAN of tests/test_custom_train_step.py (and its JAX twin).

    ``d_activation``: the discriminator's output's (``None``: logits).
    """
    discriminator = keras.Sequential([
        keras.Input((2,)),
        keras.layers.Dense(6, activation="relu", name="d_hidden"),
        keras.layers.Dense(1, activation=d_activation, name="d_out"),
    ], name="discriminator")
    generator = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(6, activation="tanh", name="g_hidden"),
        keras.layers.Dense(2, name="g_out"),
    ], name="generator")
    return discriminator, generator
