"""The benchmarked models and their synthetic, in-memory data.

Every configuration of one model trains a fresh copy built under the same
seed (identical initial weights) on the same batches in the same order.
"""

import dataclasses

import keras
import numpy as np

CLASSES = 10


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to build one benchmarked model and feed it.

    Attributes:
        name: Short name used on the command line and in the results.
        description: One line for RESULTS.md.
        input_shape: Shape of one example.
        batch_size: Examples per training step.
        build: ``fn() -> keras.Model`` (uncompiled, ends in softmax).
    """

    name: str
    description: str
    input_shape: tuple
    batch_size: int
    build: object


def _mlp():
    layers = [keras.Input((784,))]
    layers += [keras.layers.Dense(256, activation="relu") for _ in range(4)]
    layers += [keras.layers.Dense(CLASSES, activation="softmax")]
    return keras.Sequential(layers, name="mlp")


def _cnn():
    layers = [keras.Input((32, 32, 3))]
    for filters in (32, 64, 128):
        layers += [
            keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
        ]
    layers += [
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES, activation="softmax"),
    ]
    return keras.Sequential(layers, name="cnn")


def _mobilenet():
    # alpha=0.25 keeps all 91 layers (what per-layer probing cost scales
    # with) while an epoch of 100 steps stays near 1 CPU-second on 2 cores;
    # the full-width model would put the full run far over its time budget.
    return keras.applications.MobileNet(input_shape=(32, 32, 3), alpha=0.25, weights=None, classes=CLASSES)


def _transformer():
    # One post-norm encoder block (keras.layers.MultiHeadAttention, 2 heads)
    # on 16 positions of 16 features: 7.3k weights, the shape of a
    # transformer's instabilities at the size of a unit test (issue 42).
    inputs = keras.Input((16, 16))
    hidden = keras.layers.Dense(32, name="embed")(inputs)
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="attention")(hidden, hidden)
    hidden = keras.layers.LayerNormalization(name="norm_1")(hidden + attention)
    feed_forward = keras.layers.Dense(64, activation="gelu", name="ffn_in")(hidden)
    feed_forward = keras.layers.Dense(32, name="ffn_out")(feed_forward)
    hidden = keras.layers.LayerNormalization(name="norm_2")(hidden + feed_forward)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="head")(pooled)
    return keras.Model(inputs, outputs, name="transformer")


MODELS = {
    spec.name: spec
    for spec in (
        ModelSpec("mlp", "MLP 784-4x256-10, batch 128", (784,), 128, _mlp),
        ModelSpec(
            "cnn",
            "CNN 3x(Conv2D 3x3 + MaxPool) 32-64-128 on 32x32x3, GAP, Dense 10; batch 32",
            (32, 32, 3),
            32,
            _cnn,
        ),
        ModelSpec(
            "mobilenet",
            "keras.applications.MobileNet(weights=None, alpha=0.25) on 32x32x3, 10 classes; batch 16",
            (32, 32, 3),
            16,
            _mobilenet,
        ),
        ModelSpec(
            "transformer",
            "Transformer encoder block (MultiHeadAttention 2 heads x 8, FFN 64, post-norm) on 16x16, "
            "GAP, Dense 10; batch 32",
            (16, 16),
            32,
            _transformer,
        ),
    )
}


def build_model(spec, seed, jit_compile):
    """A fresh compiled model; the same ``seed`` gives the same weights.

    The loss is a loss object (not a string) so that ``model.loss`` is
    callable, as the extra-pass peer's recipe expects.
    """
    keras.utils.set_random_seed(seed)
    model = spec.build()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        jit_compile=jit_compile,
    )
    return model


def make_data(spec, distinct_batches, seed):
    """Synthetic inputs in [0, 1) and integer labels, ``distinct_batches`` batches."""
    rng = np.random.default_rng(seed)
    count = spec.batch_size * distinct_batches
    x = rng.random((count, *spec.input_shape), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=(count,), dtype=np.int64)
    return x, y


def make_dataset(spec, x, y):
    """An endless dataset of fixed batches, in order, without background threads.

    Without ``prefetch``, a configuration waiting for its turn has no
    background thread filling a buffer, so the CPU time measured during
    another configuration's turn is that configuration's alone.
    """
    import tensorflow as tf  # here only: the JAX benchmark (no TensorFlow on the GPU machine) uses MODELS

    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = dataset.batch(spec.batch_size, drop_remainder=True).repeat()
    # Nor tf.data's autotuning thread: it has nothing to tune here, and
    # ending an iterator waits for it (~2-5 s per fit on 2 cores, minutes
    # over a run).
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def first_batch(spec, x, y):
    """The first training batch as numpy arrays (for the extra-pass peer)."""
    return x[: spec.batch_size], y[: spec.batch_size]
