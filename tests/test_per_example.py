"""Per-example gradient norms against a brute-force per-example GradientTape loop (float64)."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from fit_helpers import SharedDense
from kgrad.backends.tensorflow.summarize.per_example import per_example_sq_norms
from kgrad.backends.tensorflow.summarize.instruments import (
    add_per_example_summaries,
    probe_per_example_norms,
    record_layer_inputs,
)
from kgrad.backends.tensorflow.summarize.summaries import SummaryBuilder


@pytest.fixture(autouse=True)
def _float64():
    # The dtype policy too: Keras fixes it from floatx the first time it is read.
    keras.config.set_floatx("float64")
    keras.mixed_precision.set_global_policy("float64")
    yield
    keras.config.set_floatx("float32")
    keras.mixed_precision.set_global_policy("float32")


def _per_example_losses(loss_fn, y, prediction, sample_weight):
    """ℓ_i: example i's share of J = loss_fn(y, prediction, sample_weight) (sum_over_batch_size)."""
    values = keras.losses.get(loss_fn)(y, prediction)  # [B] or [B, T]
    if sample_weight is not None:
        values = values * tf.cast(sample_weight, values.dtype)
    size = tf.cast(tf.size(values), values.dtype)
    return tf.reduce_sum(tf.reshape(values, [tf.shape(values)[0], -1]), axis=1) / size


def brute_force(model, x, y, loss_fn, sample_weight=None):
    """``{weight path: [B] ‖∇_w ℓ_i‖²}`` from one gradient per example, and ``{path: ∇J}``."""
    with tf.GradientTape(persistent=True) as tape:
        losses = _per_example_losses(loss_fn, y, model(x, training=True), sample_weight)
        total = tf.reduce_sum(losses)
        losses = tf.unstack(losses)  # each slice recorded on the tape
    weights = model.trainable_weights
    norms = {w.path: [] for w in weights}
    for loss in losses:
        for weight, gradient in zip(weights, tape.gradient(loss, weights)):
            gradient = tf.convert_to_tensor(gradient)  # Embedding: IndexedSlices
            norms[weight.path].append(float(tf.reduce_sum(tf.square(gradient))))
    batch = {w.path: tf.convert_to_tensor(g) for w, g in zip(weights, tape.gradient(total, weights))}
    return {path: np.array(values) for path, values in norms.items()}, batch


def probed(model, x, y, loss_fn, sample_weight=None, jit_compile=None):
    """``{weight path: [B] squared norms}``, ``{path: Σ_i g_i}``, reasons: from a ProbeTape."""

    def step(x, y, sample_weight):
        with kgrad.ProbeTape(model, layers="all") as tape:
            inputs = record_layer_inputs(tape)
            prediction = model(x, training=True)
            loss = keras.losses.get(loss_fn)(y, prediction)
            if sample_weight is not None:
                loss = loss * tf.cast(sample_weight, loss.dtype)
            loss = tf.reduce_mean(loss)
        tape.gradient(loss, model.trainable_weights)
        results = probe_per_example_norms(model, tape.probe, inputs)
        norms, batch = {}, {}
        for result in results.values():
            for key, value in (result.sq_norms or {}).items():
                norms[result.variables[key].path] = value
                batch[result.variables[key].path] = result.batch_gradients[key]
        return norms, batch

    if jit_compile is not None:
        step = tf.function(step, jit_compile=jit_compile)
    norms, batch = step(x, y, sample_weight)
    return {k: v.numpy() for k, v in norms.items()}, {k: v.numpy() for k, v in batch.items()}


def check(model, x, y, loss_fn, sample_weight=None, jit_compile=None, rtol=1e-4):
    model(x)  # built
    expected, expected_batch = brute_force(model, x, y, loss_fn, sample_weight)
    norms, batch = probed(model, x, y, loss_fn, sample_weight, jit_compile)
    assert sorted(norms) == sorted(expected)
    # Zero in exact arithmetic (the key bias under softmax): rounding noise only.
    scale = max(values.max() for values in expected.values())
    for path, values in expected.items():
        np.testing.assert_allclose(norms[path], values, rtol=rtol, atol=1e-20 * scale, err_msg=path)
        # Σ_i g_i is the batch gradient (no regularizer in these models).
        np.testing.assert_allclose(
            np.linalg.norm(batch[path]), np.linalg.norm(expected_batch[path]), rtol=rtol,
            atol=1e-10 * np.sqrt(scale), err_msg=path,
        )
    assert sum(values.max() > 0 for values in expected.values()) > len(expected) // 2  # not trivial
    return norms


def _images(batch=5):
    rng = np.random.default_rng(0)
    return rng.normal(size=(batch, 7, 7, 2)), rng.normal(size=(batch, 3))


def sequential_cnn():
    return keras.Sequential([
        keras.Input((7, 7, 2)),
        keras.layers.Conv2D(3, 3, strides=2, padding="same", activation="tanh", name="conv_same"),
        keras.layers.Conv2D(2, 2, dilation_rate=2, padding="valid", name="conv_dilated"),
        keras.layers.Flatten(),
        keras.layers.Dense(4, activation="relu", name="hidden"),
        keras.layers.Dense(3, name="out"),
    ])


WEIGHTS = [None, np.array([1.0, 0.0, 2.0, 0.5, 3.0])]


@pytest.mark.parametrize("jit_compile", [None, True])
@pytest.mark.parametrize("sample_weight", WEIGHTS, ids=["unweighted", "weighted"])
def test_sequential_conv2d_dense(sample_weight, jit_compile):
    x, y = _images()
    norms = check(sequential_cnn(), x, y, "mse", sample_weight, jit_compile)
    if sample_weight is not None:  # a weight-0 example contributes nothing
        assert all(values[1] == 0 for values in norms.values())


def functional_sequence():
    inputs = keras.Input((9, 3))
    h = keras.layers.Conv1D(4, 3, padding="causal", dilation_rate=2, activation="relu", name="causal")(inputs)
    h = keras.layers.Conv1D(4, 2, strides=2, groups=2, name="grouped")(h)
    h = keras.layers.Dense(5, activation="gelu", name="per_position")(h)
    h = keras.layers.LayerNormalization(name="norm")(h)
    outputs = keras.layers.Dense(2, name="out")(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(inputs, outputs)


@pytest.mark.parametrize("jit_compile", [None, True])
@pytest.mark.parametrize("sample_weight", WEIGHTS, ids=["unweighted", "weighted"])
def test_functional_conv1d_dense_on_positions_layer_norm(sample_weight, jit_compile):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(5, 9, 3)), rng.normal(size=(5, 2))
    check(functional_sequence(), x, y, "mse", sample_weight, jit_compile)


@pytest.mark.parametrize("jit_compile", [None, True])
@pytest.mark.parametrize("sample_weight", WEIGHTS, ids=["unweighted", "weighted"])
def test_subclassed_shared_layer(sample_weight, jit_compile):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(5, 8)), rng.normal(size=(5, 2))
    check(SharedDense(), x, y, "mse", sample_weight, jit_compile)


def transformer_block(vocabulary=11, length=6, width=8):
    tokens = keras.Input((length,), dtype="int32")
    h = keras.layers.Embedding(vocabulary, width, mask_zero=True, name="embed")(tokens)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(h, h)
    h = keras.layers.LayerNormalization(name="norm_1")(h + attended)
    h = keras.layers.LayerNormalization(name="norm_2")(h + keras.layers.Dense(width, activation="relu")(h))
    return keras.Model(tokens, keras.layers.Dense(vocabulary, name="logits")(h))


def _tokens():
    rng = np.random.default_rng(3)
    # Repeated ids in an example (their rows' gradients add) and padding (0).
    ids = np.array([[3, 3, 5, 1, 0, 0], [2, 7, 7, 7, 9, 0], [4, 1, 4, 1, 4, 1], [10, 6, 0, 0, 0, 0]])
    targets = rng.integers(1, 11, size=ids.shape)
    return ids, targets, (ids > 0).astype("float64")  # padding positions weigh 0


@pytest.mark.parametrize("jit_compile", [None, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_transformer_block(weighted, jit_compile):
    ids, targets, mask = _tokens()
    model = transformer_block()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    norms = check(model, ids, targets, loss, mask if weighted else None, jit_compile)
    assert any("query" in path for path in norms) and any("attention_output" in path for path in norms)
    if not weighted and jit_compile is None:
        with kgrad.ProbeTape(model, layers="all") as tape:
            inputs = record_layer_inputs(tape)
            value = tf.reduce_mean(loss(targets, model(ids)))
        tape.gradient(value, model.trainable_weights)
        builder = SummaryBuilder(histograms=False, bucket_count=1)
        # MultiHeadAttention itself is not "unsupported": its EinsumDense layers are reported.
        assert add_per_example_summaries(builder, model, tape.probe, inputs, model.trainable_weights) == {}
        assert "global/noise_batch_sq_norm" in builder.scalar_names


def test_masked_positions_have_no_gradient():
    ids, targets, mask = _tokens()
    model = transformer_block()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    with kgrad.ProbeTape(model, layers=["logits"]) as tape:
        record_layer_inputs(tape)
        value = tf.reduce_mean(loss(targets, model(ids)) * mask)
    tape.gradient(value, model.trainable_weights)
    delta = tape.probe.gradients["logits"].numpy()
    assert np.all(delta[mask == 0] == 0) and np.all(np.abs(delta[mask == 1]).sum(-1) > 0)


def test_float32_matches_float64_reference():
    x, y = _images()
    keras.config.set_floatx("float64")
    reference_model = sequential_cnn()
    reference_model(x)
    keras.config.set_floatx("float32")
    model = sequential_cnn()
    model(x.astype("float32"))
    model.set_weights(reference_model.get_weights())
    expected, _ = brute_force(reference_model, x, y, "mse")
    norms, _ = probed(model, x.astype("float32"), y.astype("float32"), "mse", jit_compile=True)
    for reference, weight in zip(reference_model.trainable_weights, model.trainable_weights):
        np.testing.assert_allclose(
            norms[weight.path], expected[reference.path], rtol=1e-4, err_msg=weight.path
        )


def test_unsupported_and_undefined_layers_are_reported_not_guessed():
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(3, name="dense"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.Dense(1, name="out"),
    ])
    x = tf.ones((4, 4), tf.float64)
    with kgrad.ProbeTape(model) as tape:
        inputs = record_layer_inputs(tape)
        loss = tf.reduce_mean(model(x, training=True))
    tape.gradient(loss, model.trainable_weights)
    results = probe_per_example_norms(model, tape.probe, inputs)
    reasons = {name: result.reason for name, result in results.items()}
    assert set(reasons) == {"dense", "bn", "out"}
    assert all("not defined" in reason and "bn" in reason for reason in reasons.values())
    builder = SummaryBuilder(histograms=False, bucket_count=1)
    assert add_per_example_summaries(builder, model, tape.probe, inputs, model.trainable_weights) == reasons
    assert builder.scalar_names == []  # nothing written, no zeros

    conv3d = keras.layers.Conv3D(1, 1)
    a = tf.ones((2, 2, 2, 2, 1), tf.float64)
    result = per_example_sq_norms(conv3d, a, conv3d(a))
    assert result.sq_norms is None and "not supported yet" in result.reason
    lstm = keras.layers.SimpleRNN(2)
    a = tf.ones((2, 3, 1), tf.float64)
    result = per_example_sq_norms(lstm, a, lstm(a))
    assert result.sq_norms is None
    assert "SimpleRNN: per-example gradient norms are not supported yet" in result.reason
    result = per_example_sq_norms(keras.layers.Dense(1), a, None)
    assert result.sq_norms is None and "unknown" in result.reason


def test_mixed_precision_unscaled_in_float32():
    x, y = _images()
    reference_model = sequential_cnn()
    reference_model(x)
    expected, _ = brute_force(reference_model, x, y, "mse")
    keras.config.set_floatx("float32")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = sequential_cnn()
        model(x.astype("float32"))
    finally:
        # The float64 of this module's other tests (set by the fixture).
        keras.config.set_floatx("float64")
        keras.mixed_precision.set_global_policy("float64")
    model.set_weights(reference_model.get_weights())
    scale = 1024.0
    with kgrad.ProbeTape(model, layers="all") as tape:
        inputs = record_layer_inputs(tape)
        prediction = tf.cast(model(x.astype("float32")), tf.float32)
        loss = scale * tf.reduce_mean(keras.losses.mean_squared_error(y.astype("float32"), prediction))
    tape.gradient(loss, model.trainable_weights)
    assert tape.probe.gradients["hidden"].dtype == tf.float16  # of the scaled loss
    results = probe_per_example_norms(
        model, tape.probe, inputs, unscale=lambda delta: tf.cast(delta, tf.float32) / scale
    )
    for reference, weight in zip(reference_model.trainable_weights, model.trainable_weights):
        result = next(r for r in results.values() if any(v is weight for v in r.variables.values()))
        key = next(k for k, v in result.variables.items() if v is weight)
        assert result.sq_norms[key].dtype == tf.float32
        # float16 forward and backward: a few 1e-3 of the largest example's.
        values = expected[reference.path]
        np.testing.assert_allclose(
            result.sq_norms[key], values, rtol=2e-2, atol=2e-3 * values.max(), err_msg=weight.path
        )


def test_regularization_losses_are_left_out_of_the_batch_gradient():
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.5), name="dense"),
    ])
    x, y = np.random.default_rng(4).normal(size=(4, 3)), np.zeros((4, 2))
    with kgrad.ProbeTape(model) as tape:
        inputs = record_layer_inputs(tape)
        data_loss = tf.reduce_mean(keras.losses.mean_squared_error(y, model(x)))
        loss = data_loss + tf.add_n(model.losses)
    kernel_gradient = tape.gradient(loss, model.trainable_weights)[0]
    result = probe_per_example_norms(model, tape.probe, inputs)["dense"]
    penalty_gradient = 2 * 0.5 * model.layers[0].kernel  # d(0.5 ‖W‖²)/dW
    np.testing.assert_allclose(result.batch_gradients["kernel"][0], kernel_gradient - penalty_gradient)


def _cross_entropy_from_probabilities(y, probabilities):
    # By hand, not Keras': the loss reaches the softmax output on the tape (no logits shortcut).
    return -tf.math.log(tf.gather(probabilities, tf.cast(y, tf.int32), batch_dims=1))


@pytest.mark.parametrize("jit_compile", [None, True])
@pytest.mark.parametrize(
    "loss", ["sparse_categorical_crossentropy", _cross_entropy_from_probabilities],
    ids=["keras_from_the_logits", "by_hand_from_the_probabilities"],
)
def test_softmax_output_under_cross_entropy(jit_compile, loss):
    # Keras computes its loss from the logits: dJ/dz is the tape's dJ/d(logits).
    # By hand, the loss reaches the probabilities: dJ/dz goes back through the softmax.
    model = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(5, activation="relu"),
        keras.layers.Dense(3, activation="softmax", name="probabilities"),
    ])
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(6, 4)), rng.integers(0, 3, size=(6,))
    check(model, x, y, loss, jit_compile=jit_compile)


@pytest.mark.parametrize("jit_compile", [None, True])
def test_sigmoid_output_under_binary_cross_entropy(jit_compile):
    model = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
        keras.layers.Dense(2, activation="sigmoid", name="probabilities"),
    ])
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(6, 4)), rng.integers(0, 2, size=(6, 2)).astype("float64")
    check(model, x, y, "binary_crossentropy", jit_compile=jit_compile)


@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
def test_the_tape_gives_dj_dlogits_of_an_output_whose_keras_loss_took_the_shortcut(activation):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation=activation, name="out")])
    rng = np.random.default_rng(7)
    x = rng.normal(size=(5, 4))
    if activation == "softmax":
        y = rng.integers(0, 3, size=(5,))
        keras_loss, targets = keras.losses.SparseCategoricalCrossentropy(), np.eye(3)[y]
    else:
        y = rng.integers(0, 2, size=(5, 3)).astype("float64")
        keras_loss, targets = keras.losses.BinaryCrossentropy(), y
    with kgrad.ProbeTape(model) as tape:
        loss = keras_loss(y, model(x))
    tape.gradient(loss, model.trainable_weights)
    logits = x @ model.layers[0].kernel.numpy() + model.layers[0].bias.numpy()
    if activation == "softmax":
        probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        expected = (probabilities - targets) / len(x)
    else:
        expected = (1 / (1 + np.exp(-logits)) - targets) / targets.size
    np.testing.assert_allclose(tape.probe.logits_gradients["out"], expected, rtol=1e-10, atol=1e-15)
    # A loss of the probabilities themselves takes no shortcut: no dJ/d(logits).
    with kgrad.ProbeTape(model) as tape:
        loss = tf.reduce_mean(tf.square(model(x)))
    tape.gradient(loss, model.trainable_weights)
    assert tape.probe.logits_gradients == {}


def test_the_norms_of_a_softmax_layer_come_from_the_tapes_dj_dlogits():
    # Not from the probabilities: doubling dJ/d(logits) quadruples the last
    # layer's squared norms and leaves the layer before it alone.
    model = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(5, activation="relu", name="hidden"),
        keras.layers.Dense(3, activation="softmax", name="probabilities"),
    ])
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(6, 4)), rng.integers(0, 3, size=(6,))
    with kgrad.ProbeTape(model, layers="all") as tape:
        inputs = record_layer_inputs(tape)
        loss = keras.losses.SparseCategoricalCrossentropy()(y, model(x))
    tape.gradient(loss, model.trainable_weights)
    assert set(tape.probe.logits_gradients) == {"probabilities"}
    doubled = dataclasses.replace(
        tape.probe, logits_gradients={"probabilities": 2 * tape.probe.logits_gradients["probabilities"]}
    )
    plain, changed = (probe_per_example_norms(model, probe, inputs) for probe in (tape.probe, doubled))
    np.testing.assert_allclose(
        changed["probabilities"].sq_norms["kernel"], 4 * plain["probabilities"].sq_norms["kernel"], rtol=1e-12
    )
    np.testing.assert_array_equal(changed["hidden"].sq_norms["kernel"], plain["hidden"].sq_norms["kernel"])


_MIRRORED_SCRIPT = """
import json, sys
import numpy as np, tensorflow as tf
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, kgrad
from kgrad.backends.tensorflow.summarize.instruments import add_per_example_summaries, record_layer_inputs
from kgrad.backends.tensorflow.summarize.summaries import SummaryBuilder
data = np.load(sys.argv[1])
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh", name="hidden"),
                              keras.layers.Dense(2, name="out")])
    model.set_weights([data[f"w{i}"] for i in range(4)])
names = []
@tf.function
def step(x, y):
    with kgrad.ProbeTape(model) as tape:
        inputs = record_layer_inputs(tape)
        per_example = tf.reduce_mean(tf.square(model(x) - y), axis=-1)
        loss = tf.reduce_sum(per_example) / 8.0  # this replica's share of the global mean
    gradients = tape.gradient(loss, model.trainable_weights)
    builder = SummaryBuilder(histograms=False, bucket_count=1)
    add_per_example_summaries(
        builder, model, tape.probe, inputs, model.trainable_weights, gradients=gradients
    )
    names[:] = builder.scalar_names
    return builder.scalars()
dataset = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((data["x"], data["y"])).batch(8))
scalars = strategy.run(step, args=next(iter(dataset)))
print(json.dumps(dict(zip(names, strategy.experimental_local_results(scalars)[0].numpy().tolist()))))
"""


@pytest.mark.slow
def test_mirrored_strategy_reports_the_global_batch(tmp_path):
    import json
    import subprocess
    import sys

    keras.config.set_floatx("float32")
    model = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(3, activation="tanh", name="hidden"),
        keras.layers.Dense(2, name="out"),
    ])
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 2)).astype("float32")
    np.savez(tmp_path / "data.npz", x=x, y=y, **{f"w{i}": w for i, w in enumerate(model.get_weights())})
    result = subprocess.run(
        [sys.executable, "-c", _MIRRORED_SCRIPT, str(tmp_path / "data.npz")],
        capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    distributed = json.loads(result.stdout.strip().splitlines()[-1])
    with kgrad.ProbeTape(model) as tape:
        inputs = record_layer_inputs(tape)
        loss = tf.reduce_mean(tf.square(model(x) - y))
    gradients = tape.gradient(loss, model.trainable_weights)
    builder = SummaryBuilder(histograms=False, bucket_count=1)
    add_per_example_summaries(
        builder, model, tape.probe, inputs, model.trainable_weights, gradients=gradients
    )
    single = dict(zip(builder.scalar_names, builder.scalars().numpy().tolist()))
    assert sorted(distributed) == sorted(single) and distributed["global/batch_size"] == 8
    for tag, value in single.items():
        assert distributed[tag] == pytest.approx(value, rel=1e-5, abs=1e-12), tag


def test_layer_inputs_are_recorded_only_when_asked():
    model = SharedDense()
    x = tf.ones((2, 8), tf.float64)
    with kgrad.ProbeTape(model) as tape:
        model(x)
    assert tape._recorder.layer_inputs == {}  # off by default: nothing kept

    with kgrad.ProbeTape(model, record_inputs=True) as tape:
        model(x)
    inputs = tape._recorder.layer_inputs
    assert list(inputs) == ["shared", "shared#2", "head"] == list(tape.activations)
    np.testing.assert_array_equal(inputs["shared#2"], x[:, 4:])


CONVOLUTIONS = {
    "conv2d_same": lambda: keras.layers.Conv2D(3, 3, padding="same"),
    "conv2d_strided_valid": lambda: keras.layers.Conv2D(4, (3, 2), strides=(2, 1), padding="valid"),
    "conv2d_dilated": lambda: keras.layers.Conv2D(2, 2, dilation_rate=2, padding="same"),
    "conv2d_grouped": lambda: keras.layers.Conv2D(4, 3, groups=2, padding="same"),
    "conv1d_causal": lambda: keras.layers.Conv1D(3, 3, padding="causal", dilation_rate=2),
    "conv1d_strided_grouped": lambda: keras.layers.Conv1D(4, 2, strides=2, groups=2),
}


@pytest.mark.parametrize("method", ["slices", "extract"])
@pytest.mark.parametrize("name", sorted(CONVOLUTIONS))
def test_both_convolution_forms_equal_a_per_example_tape(name, method):
    # The patches from strided slices, or from tf.image.extract_patches: both exact on every geometry.
    from kgrad.backends.tensorflow.summarize import conv_factor_parts
    from kgrad.backends.tensorflow.summarize.per_example import _reduce

    layer = CONVOLUTIONS[name]()
    layer = layer.__class__.from_config({**layer.get_config(), "dtype": "float64"})
    rng = np.random.default_rng(2)
    # (No channels_first case: TensorFlow runs it on GPUs only.)
    shape = (3, 9, 4) if "conv1d" in name else (3, 7, 6, 4)
    a = tf.constant(rng.normal(size=shape))
    layer.build(a.shape)
    delta = tf.constant(rng.normal(size=layer(a).shape))
    factors = conv_factor_parts.conv_factors(layer, a, delta, method=method)
    got = {key: _reduce(factored)[0].numpy() for key, factored in factors.items()}
    for i in range(shape[0]):
        with tf.GradientTape() as tape:
            out = layer(a[i : i + 1])
        kernel, bias = tape.gradient(out, [layer.kernel, layer.bias], output_gradients=delta[i : i + 1])
        np.testing.assert_allclose(got["kernel"][i], np.sum(kernel.numpy() ** 2), rtol=1e-10)
        np.testing.assert_allclose(got["bias"][i], np.sum(bias.numpy() ** 2), rtol=1e-10)
