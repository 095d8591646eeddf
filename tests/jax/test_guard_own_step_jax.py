"""kgrad.NonFiniteGuard on models with their own JAX ``train_step`` (``kgrad.value_and_grad`` in it).

The simple model of Keras' guide "Customizing what happens in fit() with
JAX" and the GAN of examples/jax_gan.py (two parts, two optimizers), with a
NaN planted in one batch of data or born in the generator's backward pass.
The state the guard keeps is compared, bit for bit, with that of a plain
``fit`` on the clean batches before the bad one (every part's weights and
every optimizer's variables); without a trip the guarded fit is the plain
one, bit for bit; jit on and off; with a `kgrad.GradientProbe` too.
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

BATCH, FEATURES = 8, 3


def _guide(jit=True, steps_per_execution=1):
    keras.backend.clear_session()  # the same variable paths in every model built
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(5, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(1, name="out")(hidden)
    model = GuideModel(inputs, outputs, name="guide")
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"], jit_compile=jit,
                  steps_per_execution=steps_per_execution)
    return model


def _data(batches, bad_batch=None, features=FEATURES):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches * BATCH, features)).astype("float32")
    y = rng.normal(size=(batches * BATCH, 1)).astype("float32")
    if bad_batch is not None:
        x[bad_batch * BATCH + 2, 1] = np.nan
    return x, y


def _state(model):
    """Every variable of the model (its parts' weights, the optimizers' variables), by path."""
    return {variable.path: np.asarray(variable.value) for variable in model.variables}


def _assert_same_state(model, expected):
    got = _state(model)
    assert sorted(got) == sorted(expected)
    for path, value in expected.items():
        assert np.all(np.isfinite(got[path])), path
        np.testing.assert_array_equal(got[path], value, err_msg=path)


def _plain_state(build, x, y, batches):
    model = build()
    if batches:
        model.fit(x[: batches * BATCH], y[: batches * BATCH], batch_size=BATCH, shuffle=False, verbose=0)
    return _state(model)


def _guide_non_finite(state, x, y):
    """``{tensor: (NaN, Inf)}`` of the non-finite loss and gradients of one batch (float64 jax.grad)."""
    paths = ("hidden/kernel", "hidden/bias", "out/kernel", "out/bias")
    with jax.enable_x64(True):
        params = [jnp.asarray(state[path], jnp.float64) for path in paths]

        def loss(params):
            kernel1, bias1, kernel2, bias2 = params
            out = jax.nn.relu(jnp.asarray(x, jnp.float64) @ kernel1 + bias1) @ kernel2 + bias2
            return jnp.mean(jnp.square(out - y))

        value, gradients = jax.value_and_grad(loss)(params)
    tensors = {"loss/guide": value} | {f"weight_grad/guide/{p}": g for p, g in zip(paths, gradients)}
    counts = {name: (int(np.isnan(t).sum()), int(np.isinf(t).sum())) for name, t in tensors.items()}
    return {name: count for name, count in counts.items() if any(count)}


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_the_guide_model_skips_the_bad_update_and_names_its_loss(jit):
    bad_batch = 2
    x, y = _data(6, bad_batch)
    expected = _plain_state(lambda: _guide(jit), x, y, bad_batch)
    model = _guide(jit)
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    assert (report.step, report.batch_index, report.last_finite_step) == (bad_batch, bad_batch, bad_batch - 1)
    assert (report.tensor, report.layer, report.kind) == ("loss/guide", "guide", "loss")
    # The counts of every non-finite tensor: those of a float64 jax.grad of the split model.
    assert report.non_finite == _guide_non_finite(expected, x[bad_batch * BATCH : (bad_batch + 1) * BATCH],
                                                  y[bad_batch * BATCH : (bad_batch + 1) * BATCH])
    # The replay of the step from the kept state: the NaN arrived with the data (NumPy's count).
    replayed = (report.replayed, report.born_in, report.born_at, report.born_nan_count)
    assert replayed == (True, "data", "input", 1)
    _assert_same_state(model, expected)  # Adam's iterations and moments too
    assert int(model.optimizer.iterations.numpy()) == bad_batch


@pytest.mark.parametrize("steps_per_execution", [1, 3])
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_without_a_trip_the_guide_model_trains_exactly_as_plain_fit(jit, steps_per_execution):
    x, y = _data(7)
    plain = _guide(jit, steps_per_execution)
    plain_history = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = _guide(jit, steps_per_execution)
    guard = kgrad.NonFiniteGuard()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[guard])
    assert guard.report is None and guard.reports == []
    _assert_same_state(model, _state(plain))
    assert history.history == plain_history.history
    assert model.train_function is not guard._step.train_function  # Keras' own again after fit


def test_steps_per_execution_3_records_the_tripped_step_and_batch():
    bad_batch = 4  # the middle step of the second execution
    x, y = _data(9, bad_batch)
    expected = _plain_state(lambda: _guide(True, 3), x, y, bad_batch)
    model = _guide(True, 3)
    guard = kgrad.NonFiniteGuard()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    assert (guard.report.step, guard.report.batch_index) == (bad_batch, bad_batch)
    _assert_same_state(model, expected)


# -- the GAN of examples/jax_gan.py ---------------------------------------------------------


def _gan(jit=True, generator_root=False):
    """examples/jax_gan.py's GAN; ``generator_root``: a sqrt Lambda in the generator."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    if not generator_root:
        gan = jax_gan.make_gan()
    else:
        # t + sqrt(0 * t) is t; its gradient is 1 + inf * 0 = NaN: born in the generator's
        # backward pass, which the discriminator's step does not run (its forward pass is finite).
        discriminator = jax_gan.make_gan().discriminator
        generator = keras.Sequential([
            keras.Input((jax_gan.LATENT,)),
            keras.layers.Dense(32, activation="relu", name="g_hidden"),
            keras.layers.Lambda(lambda t: t + keras.ops.sqrt(t * 0.0), name="root"),
            keras.layers.Dense(2, name="g_out"),
        ], name="generator")
        gan = jax_gan.GAN(discriminator, generator)
        gan.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3),
                    keras.losses.BinaryCrossentropy())
    gan.jit_compile = jit
    return gan


def _ring(batches, bad_batch=None):
    real = jax_gan.ring(batches * BATCH)
    if bad_batch is not None:
        real[bad_batch * BATCH + 1, 0] = np.nan
    return real


#: The plain GAN fits' states, by (batches, jit, the batches' bytes): several tests keep the state
#: of the same plain fit (a deterministic function of those), computed once (~3 CPU-s a fit).
_GAN_STATES = {}


def _gan_state_after(real, batches, jit):
    clean = real[: batches * BATCH]
    key = (batches, jit, clean.tobytes())
    if key not in _GAN_STATES:
        gan = _gan(jit)
        if batches:
            gan.fit(clean, batch_size=BATCH, shuffle=False, verbose=0)
        _GAN_STATES[key] = _state(gan)
    return {path: value.copy() for path, value in _GAN_STATES[key].items()}


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_a_nan_in_the_gans_data_keeps_both_parts_and_both_optimizers(jit):
    bad_batch = 3
    real = _ring(6, bad_batch)
    expected = _gan_state_after(real, bad_batch, jit)
    gan = _gan(jit)
    guard = kgrad.NonFiniteGuard()
    gan.fit(real, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    # The step is the discriminator's optimizer's iterations (the first kgrad.value_and_grad's).
    assert (report.step, report.batch_index, report.last_finite_step) == (bad_batch, bad_batch, bad_batch - 1)
    assert (report.tensor, report.layer) == ("loss/discriminator", "discriminator")
    # Inside the step the discriminator's NaN update reached the generator's pass too: its loss
    # is non-finite as well, named after the discriminator's tensors (the order of the step).
    parts = [name.split("/")[1] for name in report.non_finite]
    assert parts == sorted(parts, key=["discriminator", "generator"].index)
    assert "loss/generator" in report.non_finite
    replayed = (report.replayed, report.born_in, report.born_at, report.born_nan_count)
    assert replayed == (True, "data", "input", 1)
    # Both sub-models' weights, both optimizers' variables and the seed generator: those of before.
    _assert_same_state(gan, expected)
    assert int(gan.d_optimizer.iterations.numpy()) == int(gan.g_optimizer.iterations.numpy()) == bad_batch


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_a_nan_born_in_the_generators_backward_pass_names_the_generator(jit):
    gan = _gan(jit, generator_root=True)
    expected = _state(gan)
    guard = kgrad.NonFiniteGuard()
    gan.fit(_ring(4), batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    assert (report.step, report.batch_index, report.last_finite_step) == (0, 0, None)
    # The discriminator's loss and gradients were finite: the generator's gradients were not.
    assert report.tensor == "weight_grad/generator/g_hidden/kernel" and report.kind == "weight_grad"
    assert report.layer == "generator/g_hidden/kernel"
    assert all(name.startswith("weight_grad/generator/") for name in report.non_finite)
    # The replay names the Lambda inside the generator: dJ/d(its input) is NaN in every element
    # (1 + inf * 0) of the batch's 32 hidden units, while dJ/d(its output) is finite.
    assert report.replayed is True
    assert (report.born_in, report.born_at, report.born_type) == ("backward", "generator/root", "Lambda")
    assert (report.born_nan_count, report.born_inf_count) == (BATCH * 32, 0)
    assert "kgrad.value_and_grad 'generator'" in report.replay_note
    # The words name JAX's primitive, not TensorFlow's.
    assert "kgrad.value_and_grad 'generator'" in str(report) and "ProbeTape" not in str(report)
    # The discriminator's update of the same step is not applied either.
    _assert_same_state(gan, expected)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_without_a_trip_the_gan_trains_exactly_as_plain_fit(jit):
    real = _ring(5)
    plain = _gan(jit)
    plain.fit(real, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    gan = _gan(jit)
    guard = kgrad.NonFiniteGuard()
    gan.fit(real, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[guard])
    assert guard.report is None
    _assert_same_state(gan, _state(plain))


@pytest.mark.parametrize("order", ["probe_first", "guard_first"])
@pytest.mark.parametrize("bad_batch", [2, 3], ids=["probed_step", "unprobed_step"])
def test_the_guard_and_a_probe_together_on_the_gan(tmp_path, bad_batch, order):
    real = _ring(6, bad_batch)
    expected = _gan_state_after(real, bad_batch, True)
    gan = _gan()
    guard = kgrad.NonFiniteGuard()
    probe = kgrad.GradientProbe(str(tmp_path / "logs"), every_n_steps=2)
    callbacks = [probe, guard] if order == "probe_first" else [guard, probe]
    gan.fit(real, batch_size=BATCH, shuffle=False, verbose=0, callbacks=callbacks)
    report = guard.report
    assert (report.step, report.batch_index, report.layer) == (bad_batch, bad_batch, "discriminator")
    _assert_same_state(gan, expected)
    logs = kgrad.read_logs(str(tmp_path / "logs"))
    assert sorted(logs) == ["discriminator/kgrad", "generator/kgrad"]
    for run in logs.values():
        # Probed steps 0 and 2 ran; the probed step that tripped is written too (what the step saw).
        assert run["scalars"]["global/grad_norm"].steps.tolist() == [0, 2]


def test_without_a_trip_the_guard_and_a_probe_train_as_plain_fit(tmp_path):
    x, y = _data(5)
    plain = _guide()
    plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    model = _guide()
    callbacks = [kgrad.NonFiniteGuard(), kgrad.GradientProbe(str(tmp_path), every_n_steps=2)]
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=callbacks)
    assert callbacks[0].report is None
    _assert_same_state(model, _state(plain))
    steps = kgrad.read_logs(str(tmp_path))["guide/kgrad"]["scalars"]["global/grad_norm"].steps
    assert steps.tolist() == [0, 2, 4]


def test_replay_step_replays_an_own_train_step_part_by_part():
    gan = _gan(generator_root=True)
    before = _state(gan)
    report = kgrad.replay_step(gan, _ring(1), step=0)
    assert (report.born_in, report.born_at, report.born_type, report.step) == (
        "backward", "generator/root", "Lambda", 0)
    _assert_same_state(gan, before)  # the replay only reads the model's variables
    # A finite step replays to nothing.
    assert kgrad.replay_step(_gan(), _ring(1)) is None


def _guide_log(jit=True):
    """The guide's model with log between its layers: NaN in the forward pass where `first` < 0."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    first = keras.layers.Dense(4, name="first")(inputs)
    middle = keras.layers.Lambda(lambda t: keras.ops.log(t), name="middle")(first)
    model = GuideModel(inputs, keras.layers.Dense(1, name="out")(middle), name="guide")
    model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=jit)
    model.get_layer("first").set_weights([np.eye(FEATURES, 4, dtype="float32"), np.ones(4, "float32")])
    return model


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_watching_activations_in_an_own_train_step_names_the_part_and_layer_where_a_nan_was_born(jit):
    bad_batch = 2
    x, y = _data(4)
    x = np.abs(x)
    x[bad_batch * BATCH + 1, 0] = -5.0  # `first` = x + 1 < 0 there: log gives NaN in `middle`
    expected = _guide_log(jit)
    expected.fit(x[: bad_batch * BATCH], y[: bad_batch * BATCH], batch_size=BATCH, shuffle=False, verbose=0)
    model = _guide_log(jit)
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    assert (report.step, report.tensor, report.kind, report.pass_) == (
        bad_batch, "activation/guide/middle", "activation", "forward")
    assert (report.nan_count, report.inf_count) == (1, 0)  # one example's first unit
    assert report.born_at == "guide/middle"  # the replay agrees
    _assert_same_state(model, _state(expected))


def _fit_watched_gan_root(callbacks):
    """A fresh GAN with the sqrt Lambda, fitted on 4 batches under a guard watching every tensor."""
    gan = _gan(generator_root=True)
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    gan.fit(_ring(4), batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard, *callbacks])
    return guard.report, _state(gan)


@pytest.fixture(scope="module")
def watched_gan_root():
    """`_fit_watched_gan_root` without a probe: the report one test reads and others compare with."""
    return _fit_watched_gan_root([])


def test_watching_gradients_in_an_own_train_step_names_the_activation_whose_gradient_went_nan(
    watched_gan_root,
):
    report, _ = watched_gan_root
    # From the loss down: dJ/dŷ and dJ/d(root) are finite, dJ/d(g_hidden) = dJ/d(root's input) is not.
    assert (report.step, report.tensor, report.kind, report.pass_) == (
        0, "grad/generator/g_hidden", "grad", "backward")
    assert report.nan_count == BATCH * 32
    watched = [name for name in report.non_finite if name.startswith(("grad/", "activation/", "pred_grad/"))]
    assert watched == ["grad/generator/g_hidden"]
    assert (report.born_in, report.born_at) == ("backward", "generator/root")


def _report_fields(report):
    return (
        report.step, report.tensor, report.kind, report.pass_, report.nan_count, report.inf_count,
        report.non_finite, report.born_in, report.born_at,
    )


@pytest.mark.parametrize("every_n_steps", [1, 2])
def test_watching_with_a_probe_in_an_own_train_step_reports_what_the_guard_alone_reports(
    watched_gan_root, every_n_steps, tmp_path
):
    # The probed steps check the watched tensors in the probe's own pass of each part.
    alone, alone_state = watched_gan_root
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=every_n_steps)
    probed, probed_state = _fit_watched_gan_root([probe])
    assert alone.tensor == "grad/generator/g_hidden"
    assert _report_fields(probed) == _report_fields(alone)
    _assert_same_state_as(probed_state, alone_state)


def test_a_clean_guide_model_watched_and_probed_trains_as_plain_fit(tmp_path):
    x, y = _data(6)
    plain = _guide()
    plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    model = _guide()
    records = []
    guard = kgrad.NonFiniteGuard(layers="all", watch="all")
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=2, on_probe=records.append)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard, probe])
    assert guard.report is None
    assert [record.step for record in records] == [0, 2, 4]
    _assert_same_state(model, _state(plain))


def _assert_same_state_as(got, expected):
    assert sorted(got) == sorted(expected)
    for path, value in expected.items():
        np.testing.assert_array_equal(got[path], value, err_msg=path)


def test_a_train_step_without_kgrad_value_and_grad_is_named():
    class PlainStep(GuideModel):
        def train_step(self, state, data):
            return {}, state

    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    model = PlainStep(inputs, keras.layers.Dense(1)(inputs))
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"no kgrad.value_and_grad in the train_step.*replace"):
        model.fit(*_data(1), verbose=0, callbacks=[kgrad.NonFiniteGuard()])
