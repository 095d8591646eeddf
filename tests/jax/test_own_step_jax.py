"""Models with their own JAX ``train_step``, probed through `kgrad.value_and_grad`.

The simple model of Keras' guide "Customizing what happens in fit() with
JAX" and the GAN of examples/jax_gan.py (two sub-models, two optimizers),
with ``jax.value_and_grad`` replaced by ``kgrad.value_and_grad``. Every
logged value is compared with a float64 ``jax.grad`` of the model split by
hand (plain SGD, so the reference follows the weights step by step), jit on
and off; the weights after a probed fit are those of the un-probed one; the
GAN's tags are those TensorFlow's examples/gan.py writes.
"""

import pathlib
import sys

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kgrad
from guide_model import GuideModel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
import jax_gan  # noqa: E402

BATCH, STEPS, FEATURES, HIDDEN, RATE = 8, 4, 3, 5, 0.1
MOMENTS = ("norm", "mean", "std", "min", "max", "zero_fraction", "nonfinite")


def _guide_model(jit_compile=True, steps_per_execution=1):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(1, name="out")(hidden)
    model = GuideModel(inputs, outputs, name="guide")
    model.compile(
        keras.optimizers.SGD(RATE), "mse", metrics=["mae"], jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


def _data(samples=BATCH * STEPS, features=FEATURES):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, features)).astype("float32")
    return x, rng.normal(size=(samples, 1)).astype("float32")


def _moments(kind, name, value):
    value = np.asarray(value, np.float64)
    row = (
        np.sqrt(np.sum(value**2)), np.mean(value), np.std(value), np.min(value), np.max(value),
        np.mean(value == 0), 0.0,
    )
    return {f"{kind}_{moment}/{name}": float(v) for moment, v in zip(MOMENTS, row)}


def _weights(record, paths, before, gradients, after):
    for path, weight, gradient, updated in zip(paths, before, gradients, after):
        record.update(_moments("weight_grad", path, gradient))
        norm = float(np.linalg.norm(weight))
        change = float(np.linalg.norm(np.asarray(updated) - np.asarray(weight)))
        record[f"weight_norm/{path}"] = norm
        record[f"update_ratio/{path}"] = change / norm if norm > 0 else float(change > 0)
    record["global/grad_norm"] = float(np.sqrt(sum(np.sum(np.square(g)) for g in gradients)))


def _prediction(record, gradient):
    record.update(_moments("pred_grad", "output", gradient))
    example_norms = np.linalg.norm(np.reshape(gradient, (len(gradient), -1)), axis=1)
    record["pred_grad_example_norm_mean/output"] = float(np.mean(example_norms))
    record["pred_grad_example_norm_max/output"] = float(np.max(example_norms))


def _guide_reference(weights, x, y):
    """Per step, every value logged with statistics="all", from a float64 jax.grad of the split model."""
    records = []
    with jax.enable_x64(True):
        params = [jnp.asarray(w, jnp.float64) for w in weights]
        for step in range(STEPS):
            xb = jnp.asarray(x[step * BATCH : (step + 1) * BATCH], jnp.float64)
            yb = jnp.asarray(y[step * BATCH : (step + 1) * BATCH], jnp.float64)

            def loss(params, d_hidden, d_out, xb=xb, yb=yb):
                kernel1, bias1, kernel2, bias2 = params
                hidden = jax.nn.relu(xb @ kernel1 + bias1) + d_hidden
                out = hidden @ kernel2 + bias2 + d_out
                return jnp.mean(jnp.square(out - yb)), (hidden, out)

            zeros = (jnp.zeros((BATCH, HIDDEN)), jnp.zeros((BATCH, 1)))
            grad_fn = jax.grad(loss, (0, 1, 2), has_aux=True)
            (gradients, d_hidden, d_out), (hidden, out) = grad_fn(params, *zeros)
            record = {}
            for name, activation, gradient in (("hidden", hidden, d_hidden), ("out", out, d_out)):
                record.update(_moments("activation", name, activation))
                record.update(_moments("grad", name, gradient))
            _prediction(record, d_out)
            new = [p - RATE * g for p, g in zip(params, gradients)]
            paths = ["hidden/kernel", "hidden/bias", "out/kernel", "out/bias"]
            _weights(record, paths, params, gradients, new)
            records.append(record)
            params = new
    return records


def _assert_records(records, references):
    for record, expected in zip(records, references, strict=True):
        assert set(record.scalars) == set(expected), record.step
        for tag, value in expected.items():
            assert record.scalars[tag] == pytest.approx(value, rel=1e-4, abs=1e-6), (record.step, tag)


@pytest.mark.parametrize("jit_compile", [True, False])
def test_the_guide_model_logs_values_equal_to_a_float64_jax_grad(jit_compile, tmp_path):
    x, y = _data()
    model = _guide_model(jit_compile)
    initial = [np.asarray(w) for w in model.get_weights()]
    records = []
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=1, statistics="all", on_probe=records.append,
                                histogram_buckets="linear")
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
    assert [(record.step, record.tape) for record in records] == [(step, "guide") for step in range(STEPS)]
    _assert_records(records, _guide_reference(initial, x, y))
    # Read back from the event files: the model's run is named after it, as a TensorFlow ProbeTape's.
    logs = kgrad.read_logs(str(tmp_path))
    assert list(logs) == ["guide/kgrad"]
    steps, values = logs["guide/kgrad"]["scalars"]["grad_norm/hidden"]
    assert steps.tolist() == list(range(STEPS))
    np.testing.assert_allclose(values, [r.scalars["grad_norm/hidden"] for r in records], rtol=1e-6)
    histogram = records[0].histograms["grad_hist/hidden"]
    assert histogram.shape == (30, 3) and histogram[:, 2].sum() == BATCH * HIDDEN
    assert histogram[0, 0] == pytest.approx(records[0].scalars["grad_min/hidden"])
    assert histogram[-1, 1] == pytest.approx(records[0].scalars["grad_max/hidden"])


@pytest.mark.parametrize("jit_compile", [True, False])
def test_the_guide_model_trains_as_without_the_probe(jit_compile, tmp_path):
    x, y = _data()
    probed, plain = _guide_model(jit_compile), _guide_model(jit_compile)
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=3)
    probed_history = probed.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[probe])
    plain_history = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    for probed_weight, plain_weight in zip(probed.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(probed_weight, plain_weight, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(probed_history.history["mae"], plain_history.history["mae"], rtol=1e-6)


def test_several_steps_per_execution_log_each_probed_step(tmp_path):
    x, y = _data()
    model = _guide_model(steps_per_execution=3)
    initial = [np.asarray(w) for w in model.get_weights()]
    records = []
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=1, statistics="all", on_probe=records.append)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
    assert [record.step for record in records] == list(range(STEPS))
    _assert_records(records, _guide_reference(initial, x, y))
    records = []
    model = _guide_model(steps_per_execution=3)
    probe = kgrad.GradientProbe(str(tmp_path / "every_2"), every_n_steps=2, on_probe=records.append)
    model.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0, callbacks=[probe])
    assert [record.step for record in records] == [0, 2, 4, 6, 8, 10]
    steps, _ = kgrad.read_logs(str(tmp_path / "every_2"))["guide/kgrad"]["scalars"]["global/grad_norm"]
    assert steps.tolist() == [0, 2, 4, 6, 8, 10]


# -- the GAN of examples/jax_gan.py -------------------------------------------------------

LATENT = jax_gan.LATENT
TF_TAGS = {  # what TensorFlow's examples/gan.py writes for each tape (statistics="default")
    prefix: (
        {f"activation_zero_fraction/{prefix}_{layer}" for layer in ("hidden", "out")}
        | {f"grad_{moment}/{prefix}_{part}" for moment in ("norm", "nonfinite") for part in ("hidden", "out")}
        | {"global/grad_norm", "pred_grad_norm/output"}
        | {f"{kind}/{prefix}_{layer}/kernel" for kind in ("update_ratio", "weight_grad_norm", "weight_norm")
           for layer in ("hidden", "out")},
        {f"grad_hist/{prefix}_hidden", f"grad_hist/{prefix}_out", "pred_grad_hist/output"}
        | {f"weight_grad_hist/{prefix}_{layer}/kernel" for layer in ("hidden", "out")},
    )
    for prefix in ("d", "g")
}


def _gan(jit_compile=True, optimizer=keras.optimizers.SGD):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    gan = jax_gan.make_gan()
    gan.compile(optimizer(RATE), optimizer(RATE), keras.losses.BinaryCrossentropy())
    gan.jit_compile = jit_compile
    return gan


def _dense(params, x, d_hidden, d_out, final):
    kernel1, bias1, kernel2, bias2 = params
    hidden = jax.nn.relu(x @ kernel1 + bias1) + d_hidden
    return hidden, final(hidden @ kernel2 + bias2) + d_out


def _bce(labels, probabilities):
    probabilities = jnp.clip(probabilities, 1e-7, 1 - 1e-7)
    return -jnp.mean(labels * jnp.log(probabilities) + (1 - labels) * jnp.log(1 - probabilities))


def _part_record(prefix, activations, gradients, weights, weight_gradients, new_weights):
    record = {}
    for layer, activation, gradient in zip(("hidden", "out"), activations, gradients):
        record.update(_moments("activation", f"{prefix}_{layer}", activation))
        record.update(_moments("grad", f"{prefix}_{layer}", gradient))
    _prediction(record, gradients[1])
    paths = [f"{prefix}_{layer}/{kind}" for layer in ("hidden", "out") for kind in ("kernel", "bias")]
    _weights(record, paths, weights, weight_gradients, new_weights)
    return record


def _gan_reference(d_params, g_params, seed, real, steps):
    """Per step and sub-model, every value logged with statistics="all", from a float64 jax.grad."""
    sigmoid, identity = jax.nn.sigmoid, lambda z: z
    references = {"discriminator": [], "generator": []}
    for step in range(steps):
        d_key, g_key, seed = jax.random.split(seed, 3)  # as the step draws them, in float32
        d_noise, g_noise = (np.asarray(jax.random.normal(k, (BATCH, LATENT))) for k in (d_key, g_key))
        with jax.enable_x64(True):
            d_params, g_params = ([jnp.asarray(w, jnp.float64) for w in p] for p in (d_params, g_params))
            batch = jnp.asarray(real[step * BATCH : (step + 1) * BATCH], jnp.float64)
            labels = jnp.concatenate([jnp.ones((BATCH, 1)), jnp.zeros((BATCH, 1))])
            fake = _dense(g_params, jnp.asarray(d_noise, jnp.float64), 0, 0, identity)[1]
            images = jnp.concatenate([fake, batch])

            def d_loss(params, d_hidden, d_out, images=images, labels=labels):
                hidden, out = _dense(params, images, d_hidden, d_out, sigmoid)
                return _bce(labels, out), (hidden, out)

            zeros = (jnp.zeros((2 * BATCH, 32)), jnp.zeros((2 * BATCH, 1)))
            (grads, *taps), forward = jax.grad(d_loss, (0, 1, 2), has_aux=True)(d_params, *zeros)
            new_d = [w - RATE * g for w, g in zip(d_params, grads)]
            references["discriminator"].append(_part_record("d", forward, taps, d_params, grads, new_d))
            d_params = new_d

            noise = jnp.asarray(g_noise, jnp.float64)

            def g_loss(params, g_hidden, g_out, noise=noise, d_params=d_params):
                hidden, fake = _dense(params, noise, g_hidden, g_out, identity)
                return _bce(jnp.zeros((BATCH, 1)), _dense(d_params, fake, 0, 0, sigmoid)[1]), (hidden, fake)

            zeros = (jnp.zeros((BATCH, 32)), jnp.zeros((BATCH, 2)))
            (grads, *taps), forward = jax.grad(g_loss, (0, 1, 2), has_aux=True)(g_params, *zeros)
            new_g = [w - RATE * g for w, g in zip(g_params, grads)]
            references["generator"].append(_part_record("g", forward, taps, g_params, grads, new_g))
            g_params = new_g
    return references


# Jitted only: run eagerly it took 29 s of CI's 25 minutes; kgrad.value_and_grad run
# eagerly is checked against float64 jax.grad on the guide's model (jit_compile False).
@pytest.mark.parametrize("jit_compile", [True])
def test_the_gan_logs_each_sub_model_as_a_float64_jax_grad_does(jit_compile, tmp_path):
    real = jax_gan.ring(BATCH * 3)
    gan = _gan(jit_compile)
    d_params = [np.asarray(w) for w in gan.discriminator.get_weights()]
    g_params = [np.asarray(w) for w in gan.generator.get_weights()]
    seed = jnp.asarray(np.asarray(gan.seed_generator.state))
    records = []
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=1, statistics="all", on_probe=records.append)
    gan.fit(real, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
    references = _gan_reference(d_params, g_params, seed, real, 3)
    for part in ("discriminator", "generator"):
        part_records = [record for record in records if record.tape == part]
        assert [record.step for record in part_records] == [0, 1, 2]  # each optimizer's iterations
        _assert_records(part_records, references[part])
    assert sorted(kgrad.read_logs(str(tmp_path))) == ["discriminator/kgrad", "generator/kgrad"]


@pytest.mark.parametrize("jit_compile", [True, False])
def test_the_gan_trains_as_without_the_probe(jit_compile, tmp_path):
    # Without jit every op runs on its own (~4 s a GAN step here): fewer steps, the same checks.
    steps, epochs = (6, 2) if jit_compile else (3, 1)
    real = jax_gan.ring(BATCH * steps)
    probed, plain = _gan(jit_compile, keras.optimizers.Adam), _gan(jit_compile, keras.optimizers.Adam)
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=2)
    probed.fit(real, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=[probe])
    plain.fit(real, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    for probed_weight, plain_weight in zip(probed.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(probed_weight, plain_weight, rtol=1e-6, atol=1e-7)
    last_step = steps * epochs - 1
    assert probe.latest_by_tape["generator"].step == last_step - last_step % 2


def test_the_gan_writes_the_tags_tensorflow_writes_for_its_tapes(tmp_path):
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=2)
    _gan().fit(jax_gan.ring(BATCH * 4), batch_size=BATCH, verbose=0, callbacks=[probe])
    logs = kgrad.read_logs(str(tmp_path))
    for part, prefix in (("discriminator", "d"), ("generator", "g")):
        scalars, histograms = TF_TAGS[prefix]
        assert set(logs[f"{part}/kgrad"]["scalars"]) == scalars
        assert set(logs[f"{part}/kgrad"]["histograms"]) == histograms
        assert logs[f"{part}/kgrad"]["scalars"]["global/grad_norm"].steps.tolist() == [0, 2]


# -- what is refused, and how it says so ---------------------------------------------------


def test_an_own_train_step_without_kgrad_value_and_grad_is_told_the_fix(tmp_path):
    class Custom(keras.Sequential):
        def train_step(self, state, data):
            return super().train_step(state, data)

    model = Custom([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"found no kgrad.value_and_grad.*replace `jax.value_and_grad"):
        probe = kgrad.GradientProbe(str(tmp_path / "logs"))
        model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0, callbacks=[probe])
    assert not (tmp_path / "logs").exists()


def test_outside_a_probed_step_it_is_jax_value_and_grad():
    def loss(w, x, scale=1.0):
        return jnp.sum((w * x) ** 2) * scale, w

    w, x = jnp.arange(3.0), jnp.ones(3)
    expected = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(w, x, scale=2.0)
    received = kgrad.value_and_grad(loss, argnums=(0, 1), has_aux=True, name="part")(w, x, scale=2.0)
    assert jax.tree_util.tree_structure(received) == jax.tree_util.tree_structure(expected)
    for got, want in zip(jax.tree_util.tree_leaves(received), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({"fn": 3}, r"`fn` must be the function to differentiate.*Received: fn=3"),
        ({"argnums": "0"}, r"`argnums` must be an int or a non-empty tuple of ints.*Received: argnums='0'"),
        ({"argnums": ()}, r"Received: argnums=\(\)"),
        ({"has_aux": 1}, r"`has_aux` must be True or False. Received: has_aux=1"),
        ({"name": "a/b"}, r"`name` names the run.*Received: name='a/b'"),
    ],
)
def test_bad_arguments_are_named(arguments, match):
    arguments = {"fn": jnp.sum, **arguments}
    with pytest.raises((TypeError, ValueError), match=match):
        kgrad.value_and_grad(**arguments)


@pytest.mark.parametrize("name", ["ProbeTape", "ProbeResult"])
def test_tensorflow_only_names_name_kgrad_value_and_grad(name):
    counterpart = r"kgrad.value_and_grad\(...\)` \(the JAX counterpart\)"
    with pytest.raises(kgrad.UnsupportedBackendError, match=counterpart):
        getattr(kgrad, name)(None)
    assert "kgrad.value_and_grad" in getattr(kgrad, name).__doc__


def test_name_names_the_run_of_the_part(tmp_path):
    x, y = _data()
    model = _guide_model()
    model.part_name = "critic"
    records = []
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=2, on_probe=records.append)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[probe])
    assert [(record.tape, record.step) for record in records] == [("critic", 0), ("critic", 2)]
    assert list(kgrad.read_logs(str(tmp_path))) == ["critic/kgrad"]
    assert set(probe.latest_by_tape) == {"critic"}


def test_differentiating_copies_of_the_state_is_told_why_nothing_is_logged(tmp_path):
    x, y = _data()
    model = _guide_model()
    model.differentiate = staticmethod(lambda trainable_variables: [v * 1.0 for v in trainable_variables])
    probe = kgrad.GradientProbe(str(tmp_path / "logs"))
    with pytest.warns(UserWarning, match=r"4 of the 4 arrays it differentiates are not trainable values"):
        with pytest.raises(ValueError, match=r"none of the arrays it differentiated is a trainable value"):
            model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[probe])
    assert not (tmp_path / "logs").exists()
