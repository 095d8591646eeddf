"""The gradient noise scale and SNR: estimators, against per-example gradients, and a known answer."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from kgrad.report import noise_scale
from kgrad.backends.tensorflow.summarize.instruments import add_per_example_summaries, record_layer_inputs
from kgrad.logs.reading import Series
from kgrad.backends.tensorflow.summarize.summaries import SummaryBuilder


def direct(per_example):
    """|G|², tr(Σ) from per-example gradients G_i ([B, n]) by the sample covariance."""
    batch = per_example.shape[0]
    mean = per_example.mean(axis=0)
    trace = np.sum((per_example - mean) ** 2) / (batch - 1)  # unbiased sample covariance
    return np.sum(mean**2) - trace / batch, trace  # E|mean|² = |G|² + tr(Σ)/B


def test_one_batch_estimate_is_the_two_batch_form_and_the_sample_covariance():
    per_example = np.random.default_rng(0).normal(1.0, 2.0, size=(16, 5))
    m = np.mean(np.sum(per_example**2, axis=1))
    g = np.sum(per_example.mean(axis=0) ** 2)
    estimate = noise_scale.batch_estimate(m, g, 16)
    two = noise_scale.two_batch_estimate(m, 1, g, 16)
    expected_gradient, expected_trace = direct(per_example)
    expected = [expected_gradient, expected_trace]
    np.testing.assert_allclose([estimate.gradient_sq_norm, estimate.trace], expected)
    np.testing.assert_allclose([two.gradient_sq_norm, two.trace], expected)
    assert estimate.snr(16) == pytest.approx(16 / estimate.b_simple)
    assert noise_scale.batch_estimate(m, g, 1) is None


def test_undefined_values_are_none():
    assert noise_scale.NoiseEstimate(-1.0, 3.0).b_simple is None
    assert noise_scale.NoiseEstimate(1.0, 0.0).snr(8) is None
    assert noise_scale.NoiseEstimate(-1.0, 3.0).snr(8) is None  # no signal detected: no ratio
    assert noise_scale.NoiseScaleSmoother().b_simple is None
    with pytest.raises(ValueError, match="Received: decay=1"):
        noise_scale.NoiseScaleSmoother(decay=1)
    with pytest.raises(ValueError, match="small_batch=4"):
        noise_scale.two_batch_estimate(1.0, 4, 1.0, 2)


def model_and_data(batch=8):
    rng = np.random.default_rng(1)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(6, activation="tanh", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden))
    # Targets offset by 3: a gradient with signal, so that |G|² > 0 is estimated.
    x, y = rng.normal(size=(batch, 4)), 3 + rng.normal(size=(batch, 2))
    return model, x.astype("float32"), y.astype("float32")


def probe_scalars(model, x, y, sample_weight=None, use_gradients=False):
    """``{tag: value}`` and histograms of one probed step in a custom loop (no model.fit), under XLA."""
    names = []

    @tf.function(jit_compile=True)
    def step(x, y):
        with kgrad.ProbeTape(model) as tape:
            inputs = record_layer_inputs(tape)
            loss = keras.losses.MeanSquaredError()(y, model(x), sample_weight=sample_weight)
        gradients = tape.gradient(loss, model.trainable_weights)
        builder = SummaryBuilder(histograms=True, bucket_count=4)
        reasons = add_per_example_summaries(
            builder, model, tape.probe, inputs, model.trainable_weights,
            gradients=gradients if use_gradients else None,
        )
        assert reasons == {}
        names[:] = builder.scalar_names
        return builder.scalars(), builder.histograms()

    scalars, histograms = step(x, y)
    return dict(zip(names, scalars.numpy().tolist())), histograms.numpy()


def per_example_gradients(model, x, y, sample_weight):
    """G_i = B·∇ℓ_i per layer, ``[B, n]``: the gradient of example i's weighted loss on its own."""
    weights = np.ones(x.shape[0]) if sample_weight is None else sample_weight
    rows = {"hidden": [], "out": []}
    for i in range(x.shape[0]):
        with tf.GradientTape() as tape:
            loss = weights[i] * keras.losses.MeanSquaredError()(y[i : i + 1], model(x[i : i + 1]))
        parts = {layer: [] for layer in rows}
        for weight, gradient in zip(model.trainable_weights, tape.gradient(loss, model.trainable_weights)):
            parts[weight.path.split("/")[-2]].append(np.ravel(gradient.numpy()).astype("float64"))
        for layer in rows:
            rows[layer].append(np.concatenate(parts[layer]))  # kernel, then bias
    return {layer: np.stack(values) for layer, values in rows.items()}


@pytest.mark.parametrize("use_gradients", [False, True], ids=["from_factors", "from_tape"])
@pytest.mark.parametrize("sample_weight", [None, np.array([1, 0.5, 2, 1, 0, 1, 3, 1], "float32")])
def test_b_simple_and_snr_equal_the_direct_computation(sample_weight, use_gradients):
    model, x, y = model_and_data()
    scalars, histograms = probe_scalars(model, x, y, sample_weight, use_gradients)
    gradients = per_example_gradients(model, x, y, sample_weight)
    gradients["global"] = np.concatenate([gradients["hidden"], gradients["out"]], axis=1)
    logs = {tag: Series(np.array([0]), np.array([value], np.float64)) for tag, value in scalars.items()}
    assert scalars["global/batch_size"] == 8
    for layer in ("hidden", "out", None):
        smoother = noise_scale.smoothed_from_scalars(logs, layer)
        expected_gradient, expected_trace = direct(gradients[layer or "global"])
        assert smoother.estimate.gradient_sq_norm == pytest.approx(expected_gradient, rel=1e-3)
        assert smoother.estimate.trace == pytest.approx(expected_trace, rel=1e-3)
        assert smoother.b_simple == pytest.approx(expected_trace / expected_gradient, rel=1e-3)
        assert smoother.snr == pytest.approx(8 * expected_gradient / expected_trace, rel=1e-3)
    # Per-example norm summaries: ‖∇ℓ_i‖ = ‖G_i‖ / B; the histogram counts the B examples.
    norms = np.linalg.norm(gradients["out"][:, :12], axis=1) / 8
    assert scalars["example_grad_norm_max/out/kernel"] == pytest.approx(norms.max(), rel=1e-4)
    assert scalars["example_grad_norm_mean/out/kernel"] == pytest.approx(norms.mean(), rel=1e-4)
    assert np.all(np.sum(histograms[:, :, 2], axis=1) == 8)
    assert noise_scale.layers_in_scalars(logs) == ["hidden", "out"]


def test_linear_regression_converges_to_the_analytic_noise_scale():
    # y = w*·x + ε, x ~ N(0, I_d), ε ~ N(0, σ²), loss (w·x − y)² at w = w* + u.
    # Per-example gradient g = 2(u·x − ε)x: G = 2u and, since
    # E[(u·x)² x xᵀ] = |u|² I + 2 u uᵀ for Gaussian x, Σ = 4((|u|² + σ²) I + u uᵀ):
    # B_simple = tr(Σ)/|G|² = (d(|u|² + σ²) + |u|²) / |u|².
    dimension, sigma, batch = 4, 1.5, 32
    u = np.array([1.0, -0.5, 0.0, 0.5])
    analytic = (dimension * (u @ u + sigma**2) + u @ u) / (u @ u)
    model = keras.Sequential([keras.Input((dimension,)), keras.layers.Dense(1, use_bias=False, name="w")])
    w_star = np.random.default_rng(2).normal(size=(dimension, 1))
    model.set_weights([w_star + u[:, None]])

    names = []

    @tf.function
    def probe(x, y):
        with kgrad.ProbeTape(model) as tape:
            inputs = record_layer_inputs(tape)
            loss = keras.losses.MeanSquaredError()(y, model(x))
        tape.gradient(loss, model.trainable_weights)
        builder = SummaryBuilder(histograms=False, bucket_count=1)
        add_per_example_summaries(builder, model, tape.probe, inputs, model.trainable_weights)
        names[:] = builder.scalar_names
        return builder.scalars()

    smoother = noise_scale.NoiseScaleSmoother(decay=0.998)
    rng = np.random.default_rng(3)
    errors = {}
    for count in range(1, 1501):
        x = rng.normal(size=(batch, dimension)).astype("float32")
        y = x @ w_star.astype("float32") + sigma * rng.normal(size=(batch, 1)).astype("float32")
        scalars = dict(zip(names, probe(x, y).numpy()))  # names are filled by the first trace
        smoother.update(
            scalars["global/noise_example_sq_norm_mean"], scalars["global/noise_batch_sq_norm"],
            scalars["global/batch_size"],
        )
        if count in (30, 1500):
            errors[count] = abs(smoother.b_simple / analytic - 1)
    assert errors[1500] < 0.05, (errors, analytic)


def test_suggestion_names_the_direction():
    assert "larger batch" in noise_scale.suggestion(1000.0, 32)
    assert "well above" in noise_scale.suggestion(10.0, 512)
    assert "near" in noise_scale.suggestion(100.0, 128)
    assert "no estimate" in noise_scale.suggestion(None, 128)


def test_kgrad_report_prints_the_critical_batch_size_from_event_files(tmp_path, capsys):
    model, x, y = model_and_data(batch=32)
    writer = tf.summary.create_file_writer(str(tmp_path / "kgrad"))
    with writer.as_default():
        for step in range(3):
            scalars, _ = probe_scalars(model, x, y)
            scalars["grad_norm/out"] = 1.0  # what marks a run as kgrad's
            for tag, value in scalars.items():
                tf.summary.scalar(tag, value, step=step)
    writer.close()
    logs = kgrad.read_logs(str(tmp_path))
    critical = kgrad.health_report(logs)[0].critical_batch
    expected = noise_scale.smoothed_from_scalars(logs["kgrad"]["scalars"])
    assert critical.probes == 3 and critical.batch_size == 32
    assert critical.b_simple == pytest.approx(expected.b_simple) and set(critical.layers) == {"hidden", "out"}
    from kgrad import cli

    cli.main(["report", str(tmp_path)])
    line = [text for text in capsys.readouterr().out.splitlines() if text.startswith("critical batch")]
    assert line == [noise_scale.describe(critical)]
    assert "vs batch size 32 in use" in line[0] and "smoothed over 3 probes" in line[0]


def test_report_without_whole_model_sums_says_so():
    steps = np.array([0, 1])
    scalars = {
        "noise_example_sq_norm_mean/dense": Series(steps, np.array([11.0, 11.0])),
        "noise_batch_sq_norm/dense": Series(steps, np.array([2.0, 2.0])),
        "global/batch_size": Series(steps, np.array([10.0, 10.0])),
    }
    critical = noise_scale.critical_batch(scalars)
    assert critical.b_simple is None
    assert critical.layers == {"dense": (pytest.approx(10.0), pytest.approx(1.0))}
    assert "no whole-model estimate" in noise_scale.describe(critical)
    assert noise_scale.critical_batch({"grad_norm/dense": Series(steps, steps * 1.0)}) is None


def test_a_layer_without_an_estimate_is_named_with_the_reason():
    critical = noise_scale.CriticalBatch(812.0, 32.0, 10, 0.04, {"dense": (812.0, 0.04), "dense_2": (None, None)})
    line = noise_scale.describe(critical)
    assert line.endswith("(per layer 0.04 dense; no estimate for 1 of 2 layers, dense_2: its smoothed |G|² or "
                         "tr(Σ) estimate is not positive)")
