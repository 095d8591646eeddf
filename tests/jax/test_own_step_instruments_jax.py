"""Every instrument (``instruments=``) in a model's own JAX ``train_step``.

The model of Keras' guide (`guide_model.GuideModel`: ``kgrad.value_and_grad``
for ``jax.value_and_grad``) around a softmax classifier: Adam's tags against
the optimizer's state read back after the step and a float64 ``jax.grad`` of
the model split by hand; the logits' against that model's own pre-softmax
values; the per-example norms and noise sums against a float64 loop over the
examples (the references of tests/jax/test_instruments_jax.py). The GAN of
examples/jax_gan.py: each part's Adam tags from *its own* optimizer's state.
Attention: the same tags as Keras' own ``train_step`` writes for the same
model, weights and batch (checked there against scores computed by hand).
"""

import pathlib
import sys

import keras
import numpy as np
import pytest
from test_instruments_jax import (
    BATCH, CLASSES, FEATURES, HIDDEN, SIGMAS, STEPS, _batches, _logit_expectations, classifier_expectations,
)

import kgrad
from guide_model import GuideModel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
import jax_gan  # noqa: E402

PATHS = ["hidden/kernel", "hidden/bias", "out/kernel", "out/bias"]


def _guide_classifier(jit_compile, clipnorm=None):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="out")(hidden)
    model = GuideModel(inputs, outputs, name="guide")
    model.compile(
        keras.optimizers.Adam(0.05, global_clipnorm=clipnorm), "sparse_categorical_crossentropy",
        jit_compile=jit_compile,
    )
    return model


def _clipped(gradients, clipnorm):
    if clipnorm is None:
        return gradients
    total = np.sqrt(sum(np.sum(np.square(g)) for g in gradients))
    return [g * min(1.0, clipnorm / total) for g in gradients]


@pytest.mark.parametrize("jit_compile, clipnorm", [(True, None), (False, None), (True, 0.05)])
def test_each_instrument_of_an_own_train_step_equals_its_reference(jit_compile, clipnorm, tmp_path):
    x, y = _batches()
    model, plain = _guide_classifier(jit_compile, clipnorm), _guide_classifier(jit_compile, clipnorm)
    records = []
    probe = kgrad.GradientProbe(
        str(tmp_path), statistics="all", every_n_steps=1, instruments=["optimizer", "logits", "per_example"],
        outlier_sigmas=SIGMAS, on_probe=records.append,
    )
    steps = STEPS if jit_compile else 2
    outliers_seen = 0
    for step in range(steps):
        before = [np.asarray(w) for w in model.get_weights()]
        records.clear()
        model.fit(x[step], y[step], batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
        plain.fit(x[step], y[step], batch_size=BATCH, shuffle=False, verbose=0)
        (record,) = records
        assert record.tape == "guide"
        expected = classifier_expectations(
            model, before, x[step], y[step], PATHS, lambda gradients: _clipped(gradients, clipnorm)
        )
        for tag, value in expected.items():
            assert record.scalars[tag] == pytest.approx(value, rel=1e-4, abs=1e-6), (step, tag)
        outliers_seen += sum(record.scalars[f"grad_outlier_fraction/{path}"] > 0 for path in PATHS)
        assert record.histograms["example_grad_norm_hist/hidden/kernel"][:, 2].sum() == BATCH
    if jit_compile and clipnorm is None:
        assert outliers_seen > 0  # the outlier test was exercised, not only its zeros
    for probed_weight, plain_weight in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(probed_weight, plain_weight, rtol=1e-6, atol=1e-7)
    logs = kgrad.read_logs(str(tmp_path))["guide/kgrad"]["scalars"]
    assert logs["adam_rms/out/kernel"].steps.tolist() == list(range(steps))


def test_each_part_of_the_gan_gets_the_adam_tags_of_its_own_optimizer(tmp_path):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    gan = jax_gan.make_gan()
    # Different rates and betas: a part read with the other part's optimizer would differ.
    gan.compile(
        keras.optimizers.Adam(0.01, beta_2=0.99), keras.optimizers.Adam(0.003, beta_1=0.5),
        keras.losses.BinaryCrossentropy(),
    )
    records = []
    probe = kgrad.GradientProbe(
        str(tmp_path), every_n_steps=1, instruments=["optimizer"], on_probe=records.append,
    )
    gan.fit(jax_gan.ring(16), batch_size=16, shuffle=False, verbose=0, callbacks=[probe])
    by_part = {record.tape: record for record in records}
    assert sorted(by_part) == ["discriminator", "generator"]
    for part, optimizer, prefix in (
        ("discriminator", gan.d_optimizer, "d"), ("generator", gan.g_optimizer, "g"),
    ):
        sub_model = getattr(gan, part)
        record = by_part[part]
        assert int(np.asarray(optimizer.iterations)) == 1
        for variable in sub_model.trainable_variables:
            if len(variable.shape) < 2:  # biases: no update_ratio/, so no optimizer tags by default
                continue
            path = f"{variable.path.split('/')[-2]}/{variable.name}"
            index = optimizer._get_variable_index(variable)
            m = np.asarray(optimizer._momentums[index], np.float64)
            v = np.asarray(optimizer._velocities[index], np.float64)
            # Adam's first step: m = (1 - β1) g, v = (1 - β2) g², so g = m / (1 - β1).
            gradient = m / (1 - optimizer.beta_1)
            scaled = gradient * np.sqrt(1 - optimizer.beta_2) / (np.sqrt(v) + optimizer.epsilon)
            assert path.startswith(f"{prefix}_")
            assert record.scalars[f"adam_rms/{path}"] == pytest.approx(
                np.sqrt(np.mean(np.square(scaled))), rel=1e-4
            ), (part, path)


ATTENTION_VOCAB, ATTENTION_LENGTH = 9, 5


def _attention_model(cls):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((ATTENTION_LENGTH,), dtype="int32")
    x = keras.layers.Embedding(ATTENTION_VOCAB, 8, name="embed")(tokens)
    h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(x, x, use_causal_mask=True)
    model = cls(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)), name="attn")
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def test_attention_tags_of_an_own_train_step_are_those_of_keras_own_step(tmp_path):
    ids = np.random.default_rng(0).integers(1, ATTENTION_VOCAB, size=(4, ATTENTION_LENGTH)).astype("int32")
    target = np.ones((4, 1), "float32")
    scalars = {}
    for kind, cls in (("keras", keras.Model), ("own", GuideModel)):
        records = []
        probe = kgrad.GradientProbe(
            str(tmp_path / kind), every_n_steps=1, instruments=["attention"], attention_examples=2,
            on_probe=records.append,
        )
        _attention_model(cls).fit(ids, target, batch_size=4, verbose=0, callbacks=[probe])
        (record,) = records
        scalars[kind] = {tag: v for tag, v in record.scalars.items() if tag.startswith("attention_")}
    assert sorted(scalars["own"]) == sorted(scalars["keras"]) == sorted(
        f"attention_{kind}/mha/head_{head}" for kind in ("logit_max", "entropy") for head in (0, 1)
    )
    for tag, value in scalars["keras"].items():
        assert scalars["own"][tag] == pytest.approx(value, rel=1e-6), tag


def test_a_part_without_logits_says_why_and_writes_none(tmp_path):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    gan = jax_gan.make_gan()
    gan.compile(keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1), keras.losses.BinaryCrossentropy())
    records = []
    probe = kgrad.GradientProbe(
        str(tmp_path), every_n_steps=1, instruments=["logits"], on_probe=records.append,
    )
    with pytest.warns(UserWarning, match="no logit statistics for 'output': a sigmoid output"):
        gan.fit(jax_gan.ring(16), batch_size=16, shuffle=False, verbose=0, callbacks=[probe])
    discriminator = next(record for record in records if record.tape == "discriminator")
    assert not [tag for tag in discriminator.scalars if tag.startswith("logit_")]



def _adam_gan():
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    made = jax_gan.make_gan()
    made.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.01), keras.losses.BinaryCrossentropy())
    return made


def _fit_gan(gan, callbacks=()):
    gan.fit(jax_gan.ring(32), batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=list(callbacks))
    return gan


@pytest.fixture(scope="module")
def plain_gan_weights():
    """`_adam_gan` fitted by `_fit_gan` without callbacks: both cases of the test below compare with it."""
    return _fit_gan(_adam_gan()).get_weights()


@pytest.mark.parametrize("guarded", [False, True])
def test_the_gan_with_every_instrument_trains_as_without_the_probe(plain_gan_weights, guarded, tmp_path):
    probed = _adam_gan()
    records = []
    probe = kgrad.GradientProbe(
        str(tmp_path), every_n_steps=2, instruments=["per_example", "optimizer", "logits"],
        on_probe=records.append,
    )
    callbacks = [probe, kgrad.NonFiniteGuard()] if guarded else [probe]
    with pytest.warns(UserWarning, match="a sigmoid output"):
        _fit_gan(probed, callbacks)
    for probed_weight, plain_weight in zip(probed.get_weights(), plain_gan_weights, strict=True):
        np.testing.assert_allclose(probed_weight, plain_weight, rtol=1e-6, atol=1e-7)
    latest = {record.tape: record for record in records}
    # The discriminator's step sees the fake and the real images: 16 examples; the generator's 8.
    for part, prefix, rows in (("discriminator", "d", 16.0), ("generator", "g", 8.0)):
        scalars = latest[part].scalars
        assert scalars["global/batch_size"] == rows
        for tag in (f"example_grad_norm_max/{prefix}_hidden/kernel", f"adam_rms/{prefix}_hidden/kernel"):
            assert np.isfinite(scalars[tag]) and scalars[tag] > 0, (part, tag)


def test_a_guard_watching_every_tensor_leaves_the_parts_logits_found(tmp_path):
    """NonFiniteGuard(watch="all") taps dJ/dŷ in the part's pass too: its softmax's logits stay found."""
    x, y = _batches()
    model = _guide_classifier(True)
    hidden, out = model.get_layer("hidden"), model.get_layer("out")
    relu = np.maximum(x[0] @ np.asarray(hidden.kernel) + np.asarray(hidden.bias), 0)
    z = relu @ np.asarray(out.kernel) + np.asarray(out.bias)  # the logits, before the step
    records = []
    model.fit(x[0], y[0], batch_size=BATCH, verbose=0, callbacks=[
        kgrad.GradientProbe(str(tmp_path), every_n_steps=1, instruments=["logits"], on_probe=records.append),
        kgrad.NonFiniteGuard(watch="all"),
    ])
    for tag, value in _logit_expectations(z).items():
        assert records[0].scalars[tag] == pytest.approx(value, rel=1e-4, abs=1e-6), tag
