"""``instruments=["optimizer", "logits", "per_example"]`` on Keras' JAX backend, against references.

Each statistic is compared with one computed another way: Adam's tags from
the optimizer's state read back after the step (``model.optimizer.variables``)
and a float64 ``jax.grad`` of the model split by hand, in NumPy; the logits'
from the model's own pre-softmax values; the per-example norms from a
brute-force loop of float64 ``jax.grad``, one example at a time. Jit on and
off; the weights after the probed fits are the plain fits'. The backend-free tests of
tests/test_stability_instruments.py that these do not hold already run here too.
"""

import warnings

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad
from fit_helpers import SharedDense
from test_stability_instruments import (  # noqa: F401 (collected here, in the JAX run)
    test_a_sigmoid_output_gets_no_logit_statistics_and_a_reason,
    test_logit_statistics_of_a_softmax_classifier_are_of_its_logits,
    test_other_optimizers_give_update_rms_only_and_say_why,
    test_outlier_sigmas_must_be_a_positive_number,
    test_training_is_unchanged_by_the_stability_instruments,
    test_with_gradient_accumulation_records_carry_keras_iterations_and_training_is_unchanged,
)

BATCH, FEATURES, HIDDEN, CLASSES, STEPS = 8, 3, 4, 3, 3
INSTRUMENTS = ["optimizer", "logits", "per_example"]
SIGMAS = 1.0  # small enough that some entries are outliers


def _classifier(jit_compile):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="out")(hidden)
    model = keras.Model(inputs, outputs, name="m")
    model.compile(keras.optimizers.Adam(0.05), "sparse_categorical_crossentropy", jit_compile=jit_compile)
    return model


def _batches():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(STEPS, BATCH, FEATURES)).astype("float32")
    return x, rng.integers(0, CLASSES, size=(STEPS, BATCH))


def _norm(a):
    return float(np.sqrt(np.sum(np.square(np.asarray(a, np.float64)))))


def _classifier_reference(weights, xb, yb):
    """Float64: the batch gradient, per-example gradients (ℓ_i = CE_i / B) and the logits."""
    with jax.enable_x64(True):
        params = [jnp.asarray(w, jnp.float64) for w in weights]
        xb = jnp.asarray(xb, jnp.float64)

        def logits(params, x):
            k1, b1, k2, b2 = params
            return jax.nn.relu(x @ k1 + b1) @ k2 + b2

        def example_loss(params, x, label):
            z = logits(params, x[None])[0]
            return (jax.nn.logsumexp(z) - z[label]) / BATCH

        gradient = jax.jit(jax.grad(example_loss))  # one example at a time
        per_example = [gradient(params, xb[i], jnp.asarray(yb[i])) for i in range(BATCH)]
        per_example = [[np.asarray(g) for g in example] for example in per_example]
        batch = [sum(example[w] for example in per_example) for w in range(4)]
        return batch, per_example, np.asarray(logits(params, xb))


def _logit_expectations(z, name="output"):
    z = np.asarray(z, np.float64).reshape(-1, z.shape[-1])
    lse = np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)
    p = np.exp(z - lse[:, None])
    values = {
        "logit_max": z.max(-1),
        "logit_lse": lse,
        "logit_entropy": -np.sum(p * np.log(p), -1),
        "logit_top1_prob": p.max(-1),
    }
    expected = {}
    for kind, per_position in values.items():
        expected[f"{kind}_mean/{name}"] = float(per_position.mean())
        expected[f"{kind}_max/{name}"] = float(per_position.max())
    return expected


def _example_expectations(per_example, paths, layers, batch=BATCH):
    """The per-example tags of weights ``paths`` (numbered as in ``per_example``) grouped by ``layers``."""
    expected, example_total, batch_total = {}, 0.0, 0.0
    for layer, numbers in layers.items():
        example_sum = batch_sum = 0.0
        for number in numbers:
            norms = [_norm(example[number]) for example in per_example]
            expected[f"example_grad_norm_mean/{paths[number]}"] = float(np.mean(norms))
            expected[f"example_grad_norm_max/{paths[number]}"] = float(np.max(norms))
            example_sum += sum(n * n for n in norms)
            batch_sum += _norm(sum(example[number] for example in per_example)) ** 2
        expected[f"noise_example_sq_norm_mean/{layer}"] = batch * example_sum
        expected[f"noise_batch_sq_norm/{layer}"] = batch_sum
        example_total, batch_total = example_total + example_sum, batch_total + batch_sum
    expected["global/noise_example_sq_norm_mean"] = batch * example_total
    expected["global/noise_batch_sq_norm"] = batch_total
    expected["global/batch_size"] = float(batch)
    return expected


def _adam_expectations(model, gradients, paths):
    """adam_rms/ and grad_outlier_fraction/ from Adam's state read back after the step, in NumPy."""
    optimizer = model.optimizer
    t = float(np.asarray(optimizer.iterations))
    beta_1, beta_2, epsilon = optimizer.beta_1, optimizer.beta_2, optimizer.epsilon
    expected = {}
    for variable, gradient, path in zip(model.trainable_variables, gradients, paths):
        index = optimizer._get_variable_index(variable)
        m = np.asarray(optimizer._momentums[index], np.float64)
        v = np.asarray(optimizer._velocities[index], np.float64)
        scaled = gradient * np.sqrt(1 - beta_2**t) / (np.sqrt(v) + epsilon)
        expected[f"adam_rms/{path}"] = float(np.sqrt(np.mean(np.square(scaled))))
        m_hat, v_hat = m / (1 - beta_1**t), v / (1 - beta_2**t)
        variance = v_hat - m_hat**2
        outlier = (variance > 0) & (np.abs(gradient - m_hat) > SIGMAS * np.sqrt(np.maximum(variance, 0)))
        expected[f"grad_outlier_fraction/{path}"] = float(np.mean(outlier))
    return expected


def classifier_expectations(model, before, xb, yb, paths, applied=lambda gradients: gradients):
    """Every instrument's tags of one step of `_classifier` (``applied``: the optimizer's clipping)."""
    gradients, per_example, logits = _classifier_reference(before, xb, yb)
    expected = _adam_expectations(model, applied(gradients), paths)
    expected.update(_logit_expectations(logits))
    expected.update(_example_expectations(per_example, paths, {"hidden": [0, 1], "out": [2, 3]}))
    for path, old, new in zip(paths, before, model.get_weights()):
        expected[f"update_rms/{path}"] = _norm(new - old) / np.sqrt(old.size)
    return expected


# Without jit each op runs on its own (slow): one plain step, then one probed step.
@pytest.mark.parametrize("jit_compile, first_probed", [(True, 0), (False, STEPS - 1)])
def test_each_instrument_equals_its_reference_and_training_is_unchanged(jit_compile, first_probed, tmp_path):
    x, y = _batches()
    model, plain = _classifier(jit_compile), _classifier(jit_compile)
    paths = ["hidden/kernel", "hidden/bias", "out/kernel", "out/bias"]
    outliers_seen = 0
    for step in range(STEPS):
        if step < first_probed:  # Adam's moments get a history before the probed steps
            for trained in (model, plain):
                trained.fit(x[step], y[step], batch_size=BATCH, shuffle=False, verbose=0)
            continue
        before = [np.asarray(w) for w in model.get_weights()]
        records = []
        probe = kgrad.GradientProbe(
            str(tmp_path), statistics="all", every_n_steps=1, instruments=INSTRUMENTS,
            outlier_sigmas=SIGMAS, on_probe=records.append,
        )
        model.fit(x[step], y[step], batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
        plain.fit(x[step], y[step], batch_size=BATCH, shuffle=False, verbose=0)
        (record,) = records
        expected = classifier_expectations(model, before, x[step], y[step], paths)
        for tag, value in expected.items():
            assert record.scalars[tag] == pytest.approx(value, rel=1e-4, abs=1e-6), (step, tag)
        outliers_seen += sum(record.scalars[f"grad_outlier_fraction/{path}"] > 0 for path in paths)
        histogram = record.histograms["example_grad_norm_hist/hidden/kernel"]
        assert histogram[:, 2].sum() == BATCH
    assert outliers_seen > 0  # the outlier test was exercised, not only its zeros
    for probed_weight, plain_weight in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(probed_weight, plain_weight, rtol=1e-6, atol=1e-7)
    logs = kgrad.read_logs(str(tmp_path))["kgrad"]["scalars"]
    assert logs["adam_rms/out/kernel"].steps.tolist() == list(range(first_probed, STEPS))


@pytest.mark.parametrize("capture", [None, ["activations"]], ids=["with_weight_rows", "without"])
def test_update_rms_equals_the_change_with_or_without_the_weights_rows(capture, tmp_path):
    # With the weights' rows, update_rms/ takes ‖Δw‖ from update_ratio/'s read; without, it reads it.
    x, y = _batches()
    model = _classifier(True)
    before = [np.asarray(w, np.float64) for w in model.get_weights()]
    records = []
    options = {} if capture is None else {"capture": capture}
    model.fit(x[0], y[0], batch_size=BATCH, shuffle=False, verbose=0, callbacks=[kgrad.GradientProbe(
        str(tmp_path), statistics="all", every_n_steps=1, instruments=["optimizer"], on_probe=records.append,
        **options)])
    (record,) = records
    paths = ["hidden/kernel", "hidden/bias", "out/kernel", "out/bias"]
    assert ("update_ratio/hidden/kernel" in record.scalars) == (capture is None)
    for path, old, new in zip(paths, before, model.get_weights()):
        expected = _norm(np.asarray(new, np.float64) - old) / np.sqrt(old.size)
        assert record.scalars[f"update_rms/{path}"] == pytest.approx(expected, rel=1e-5), path


VOCAB, LENGTH, SEQUENCES = 7, 5, 4


def _sequence_model(dtype="float32"):
    """Embedding → Conv1D → LayerNormalization → Dense(tanh) → EinsumDense → Dense head (logits)."""
    inputs = keras.Input((LENGTH,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(VOCAB, 4, name="embed", dtype=dtype)(inputs)
    h = keras.layers.Conv1D(3, 2, padding="same", name="conv", dtype=dtype)(h)
    h = keras.layers.LayerNormalization(name="norm", dtype=dtype)(h)
    h = keras.layers.Dense(2, activation="tanh", name="mix", dtype=dtype)(h)  # P² > K·N: explicit form
    h = keras.layers.EinsumDense("btd,de->bte", (None, 5), bias_axes="e", name="proj", dtype=dtype)(h)
    logits = keras.layers.Dense(VOCAB, name="head", dtype=dtype)(h)  # P² ≤ K·N: Gram matrices
    return keras.Model(inputs, logits, name="lm")


def test_sequence_layers_per_example_norms_and_lm_logits_against_a_float64_loop(tmp_path):
    keras.utils.set_random_seed(0)
    model = _sequence_model()
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, VOCAB, size=(SEQUENCES, LENGTH)).astype("int32")
    labels = rng.integers(0, VOCAB, size=(SEQUENCES, LENGTH))
    weights = [np.asarray(w) for w in model.get_weights()]
    records = []
    model.fit(tokens, labels, batch_size=SEQUENCES, verbose=0, callbacks=[kgrad.GradientProbe(
        str(tmp_path), every_n_steps=1, instruments=INSTRUMENTS, on_probe=records.append)])
    with jax.enable_x64(True):
        reference = _sequence_model("float64")
        reference.set_weights(weights)
        params = [jnp.asarray(w, jnp.float64) for w in weights]

        def example_loss(params, example_tokens, example_labels):
            z = reference.stateless_call(params, [], example_tokens[None])[0][0]
            picked = jnp.take_along_axis(z, example_labels[:, None], axis=-1)[:, 0]
            return jnp.sum(jax.nn.logsumexp(z, axis=-1) - picked) / (SEQUENCES * LENGTH)

        gradient = jax.jit(jax.grad(example_loss))  # one example at a time
        per_example = [
            [np.asarray(g) for g in gradient(params, tokens[i], labels[i])] for i in range(SEQUENCES)
        ]
        logits = np.asarray(reference.stateless_call(params, [], tokens)[0])
    paths = [v.path.removeprefix("lm/") for v in model.trainable_variables]
    layers = {}
    for number, path in enumerate(paths):
        layers.setdefault(path.partition("/")[0], []).append(number)
    expected = _example_expectations(per_example, paths, layers, batch=SEQUENCES)
    expected.update(_logit_expectations(logits))
    (record,) = records
    for tag, value in expected.items():
        assert record.scalars[tag] == pytest.approx(value, rel=1e-4, abs=1e-6), tag


def _fit_warnings(model, x, y, instruments, tmp_path):
    records = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[kgrad.GradientProbe(
            str(tmp_path), every_n_steps=1, instruments=instruments, on_probe=records.append)])
    return records[0].scalars, " ".join(str(w.message) for w in caught if "kgrad" in str(w.message))


def test_what_cannot_be_computed_is_absent_with_the_reason(tmp_path):
    x, y = _batches()
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.BatchNormalization(name="bn")(keras.layers.Dense(HIDDEN, name="hidden")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid", name="out")(hidden))
    model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy")
    scalars, said = _fit_warnings(model, x[0], y[0] % 2, INSTRUMENTS, tmp_path)
    assert not [tag for tag in scalars if tag.startswith(("example_grad", "noise_", "adam_rms", "logit_"))]
    assert "global/batch_size" not in scalars and "update_rms/hidden/kernel" in scalars
    assert "'bn' (BatchNormalization in training mode) couples the examples" in said
    assert "plain SGD keeps no state at all" in said
    assert "a sigmoid output: independent probabilities" in said


@pytest.mark.parametrize("jit_compile", [True, False])
def test_a_layer_called_twice_gets_the_norms_of_the_sum_of_its_calls(jit_compile, tmp_path):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(BATCH, 8)).astype("float32"), rng.normal(size=(BATCH, 2)).astype("float32")
    keras.utils.set_random_seed(0)
    model = SharedDense()  # a Dense layer called twice in a step
    model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=jit_compile)
    model(x[:1])  # builds the weights
    weights = [np.asarray(w) for w in model.trainable_variables]  # the first probed step's
    scalars, said = _fit_warnings(model, x, y, ["per_example"], tmp_path)
    assert "called more than once" not in said and "'shared'" not in said
    with jax.enable_x64(True):
        params = [jnp.asarray(w, jnp.float64) for w in weights]

        def example_loss(params, x_i, y_i):  # mse's share of the batch loss: 1/B of its mean
            k1, b1, k2, b2 = params
            shared = lambda v: jnp.tanh(v @ k1 + b1)  # noqa: E731
            prediction = (shared(x_i[:4]) * shared(x_i[4:])) @ k2 + b2
            return jnp.mean(jnp.square(prediction - y_i)) / BATCH

        gradient = jax.jit(jax.grad(example_loss))
        per_example = [[np.asarray(g) for g in gradient(params, jnp.asarray(x[i], jnp.float64),
                                                         jnp.asarray(y[i], jnp.float64))]
                       for i in range(BATCH)]
    paths = ["shared/kernel", "shared/bias", "head/kernel", "head/bias"]
    expected = _example_expectations(per_example, paths, {"shared": [0, 1], "head": [2, 3]})
    for tag, value in expected.items():
        np.testing.assert_allclose(float(scalars[tag]), value, rtol=1e-4, err_msg=tag)


def test_a_shared_layer_too_large_to_hold_is_refused_clearly(tmp_path, monkeypatch):
    from kgrad.backends.jax.summarize import per_example

    monkeypatch.setattr(per_example, "SHARED_FLOATS", 10)
    x, y = _batches()
    inputs = keras.Input((FEATURES,))
    shared = keras.layers.Dense(FEATURES, name="shared")
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(shared(shared(inputs))))
    model.compile(keras.optimizers.Adam(), "mse")
    scalars, said = _fit_warnings(model, x[0], y[0].astype("float32"), ["per_example"], tmp_path)
    assert "'shared': called 2 times in the step: its per-example norms need each call's" in said
    assert "example_grad_norm_mean/out/kernel" in scalars and "global/noise_batch_sq_norm" not in scalars


ATTENTION_LENGTH, ATTENTION_VOCAB, EXAMPLES = 6, 20, 3


@pytest.mark.parametrize("masking", ["padding", "causal"])
def test_attention_statistics_equal_scores_computed_by_hand(masking, tmp_path):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((ATTENTION_LENGTH,), dtype="int32")
    x = keras.layers.Embedding(ATTENTION_VOCAB, 8, mask_zero=masking == "padding", name="embed")(tokens)
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")
    h = attention(x, x, use_causal_mask=masking == "causal")
    model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
    model.compile(keras.optimizers.Adam(0.01), "mse")
    rng = np.random.default_rng(0)
    lengths = np.array([ATTENTION_LENGTH, 3, 1, 4])  # padding at the end of most examples
    padding = np.arange(ATTENTION_LENGTH)[None, :] < lengths[:, None]
    ids = rng.integers(1, ATTENTION_VOCAB, size=padding.shape).astype("int32") * padding
    embedded = np.asarray(model.get_layer("embed").embeddings, np.float64)[ids][:EXAMPLES]

    def project(dense):
        kernel = np.asarray(dense.kernel, np.float64)
        return np.einsum("btd,dnh->btnh", embedded, kernel) + np.asarray(dense.bias)

    q, k = project(attention._query_dense), project(attention._key_dense)
    scores = np.einsum("btnh,bsnh->bnts", q, k) / 2.0  # 1/√key_dim
    if masking == "padding":  # Keras' mask of the query and of the value
        allowed = padding[:EXAMPLES, :, None] & padding[:EXAMPLES, None, :]
    else:
        causal = np.tril(np.ones((ATTENTION_LENGTH, ATTENTION_LENGTH), bool))
        allowed = np.broadcast_to(causal, (EXAMPLES, ATTENTION_LENGTH, ATTENTION_LENGTH))
    allowed = np.broadcast_to(allowed[:, None], scores.shape)
    expected = {}
    for head in range(2):
        rows = [(b, t) for b in range(EXAMPLES) for t in range(ATTENTION_LENGTH) if allowed[b, head, t].any()]
        entropies = []
        for b, t in rows:
            z = scores[b, head, t][allowed[b, head, t]]
            p = np.exp(z - z.max()) / np.sum(np.exp(z - z.max()))
            entropies.append(-np.sum(p * np.log(p)))
        largest = np.where(allowed[:, head], scores[:, head], -np.inf).max()
        expected[f"attention_logit_max/mha/head_{head}"] = float(largest)
        expected[f"attention_entropy/mha/head_{head}"] = float(np.mean(entropies))
    records = []
    model.fit(ids, np.ones((len(ids), 1)), batch_size=len(ids), verbose=0, callbacks=[kgrad.GradientProbe(
        str(tmp_path), every_n_steps=1, instruments=["attention"], attention_examples=EXAMPLES,
        on_probe=records.append)])
    (record,) = records
    assert sorted(tag for tag in record.scalars if tag.startswith("attention_")) == sorted(expected)
    for tag, value in expected.items():
        assert record.scalars[tag] == pytest.approx(value, rel=1e-4), tag


def test_attention_without_attention_layers_says_so(tmp_path):
    x, y = _batches()
    model = _classifier(True)
    scalars, said = _fit_warnings(model, x[0], y[0], ["attention"], tmp_path)
    assert not [tag for tag in scalars if tag.startswith("attention_")]
    assert "model 'm' called no attention layer in its step, so nothing is written" in said


@pytest.mark.parametrize("ending", ["dense", "activation_layer", "softmax_layer", "ops_softmax"])
def test_the_logits_behind_every_kind_of_final_softmax(ending, tmp_path):
    x, y = _batches()
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    logits = keras.layers.Dense(CLASSES, name="logits")(inputs)
    softmax = {
        "activation_layer": lambda z: keras.layers.Activation("softmax")(z),
        "softmax_layer": lambda z: keras.layers.Softmax()(z),
        "ops_softmax": keras.ops.softmax,
    }
    if ending == "dense":
        model = keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax", name="logits")(inputs))
    else:
        model = keras.Model(inputs, softmax[ending](logits))
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    layer = model.get_layer("logits")  # the model's own logits, before the step
    z = x[0] @ np.asarray(layer.kernel) + np.asarray(layer.bias)
    scalars, said = _fit_warnings(model, x[0], y[0], ["logits"], tmp_path)
    for tag, value in _logit_expectations(z).items():
        assert scalars[tag] == pytest.approx(value, rel=1e-4, abs=1e-6), tag
    assert said == ""


def test_a_keras_hub_language_model_logits_and_attention(tmp_path):
    """GPT-2 (KerasHub, built from a config): the LM head's logits are the model's own output."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=8, dropout=0.0,
    )
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    lm.compile(keras.optimizers.AdamW(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids = np.random.default_rng(0).integers(1, 50, size=(4, 8)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}
    expected = _logit_expectations(np.asarray(lm(x, training=False)))  # dropout=0: as in training
    records = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm.fit(x, np.roll(ids, -1, 1), batch_size=4, verbose=0, callbacks=[kgrad.GradientProbe(
            str(tmp_path), every_n_steps=1, instruments=[*INSTRUMENTS, "attention"],
            on_probe=records.append)])
    (record,) = records
    for tag, value in expected.items():
        assert record.scalars[tag] == pytest.approx(value, rel=1e-4, abs=1e-6), tag
    heads = {tag for tag in record.scalars if tag.startswith("attention_entropy/")}
    assert heads == {f"attention_entropy/transformer_layer_0/self_attention/head_{h}" for h in (0, 1)}
    said = " ".join(str(w.message) for w in caught)
    assert "'token_embedding': ReversibleEmbedding: per-example gradient norms are not supported" in said
    assert "example_grad_norm_max/transformer_layer_0/self_attention/query/kernel" in record.scalars


def test_mixed_float16_per_example_sums_are_of_the_true_loss(tmp_path):
    """Under a LossScaleOptimizer the carriers unscale dJ/d(output): Σ_i ∇ℓ_i is the true gradient."""
    x, y = _batches()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(inputs)
        outputs = keras.layers.Dense(CLASSES, activation="softmax", name="out", dtype="float32")(hidden)
        model = keras.Model(inputs, outputs, name="m")
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01))
        model.compile(optimizer, "sparse_categorical_crossentropy")
        scalars, said = _fit_warnings(model, x[0], y[0], INSTRUMENTS, tmp_path)
    finally:
        keras.config.set_dtype_policy("float32")
    assert said == "" and scalars["global/loss_scale"] > 1
    # ‖∇J‖² two ways: the per-example carriers' batch sums, and the step's own weight gradients.
    assert scalars["global/noise_batch_sq_norm"] == pytest.approx(scalars["global/grad_norm"] ** 2, rel=1e-2)
    assert 0.1 < scalars["adam_rms/hidden/kernel"] < 10  # Adam's units, not the loss scale's


def test_a_guard_watching_every_tensor_leaves_the_logits_found(tmp_path):
    """A guard watching dJ/dŷ of the softmax output in the probe's pass leaves its logits found."""
    x, y = _batches()
    model = _classifier(True)
    layer = model.get_layer("hidden"), model.get_layer("out")
    hidden = np.maximum(x[0] @ np.asarray(layer[0].kernel) + np.asarray(layer[0].bias), 0)
    z = hidden @ np.asarray(layer[1].kernel) + np.asarray(layer[1].bias)  # the logits, before the step
    records = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x[0], y[0], batch_size=BATCH, verbose=0, callbacks=[
            kgrad.GradientProbe(str(tmp_path / "p"), every_n_steps=1, instruments=["logits"],
                                on_probe=records.append),
            kgrad.NonFiniteGuard(watch="all"),
        ])
    for tag, value in _logit_expectations(z).items():
        assert records[0].scalars[tag] == pytest.approx(value, rel=1e-4, abs=1e-6), tag
    assert not [str(w.message) for w in caught if "logit" in str(w.message)]
    assert "pred_grad_norm/output" in records[0].scalars
