"""`kgrad.ProbeTape`: every gradient it returns, checked against a reference.

References are computed another way: a plain ``tf.GradientTape`` over the same
model split by hand (each intermediate tensor watched explicitly), and central
finite differences in float64.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from references import central_difference

MODES = ["eager", "function", "xla"]
F64 = "float64"


@pytest.fixture(autouse=True)
def _fresh_names():
    # Keras numbers op names ("sin", "sin_1"...) per session.
    keras.backend.clear_session(free_memory=False)


def _compiled(fn, mode):
    if mode == "eager":
        return fn
    return tf.function(fn, jit_compile=mode == "xla")


def _loss(prediction, target):
    return tf.reduce_mean(tf.square(prediction - target)) + tf.reduce_sum(prediction) / 7.0


# --- the three kinds of model, each with its hand-split twin ----------------


def _sequential():
    model = keras.Sequential(
        [
            keras.Input((3,), dtype=F64),
            keras.layers.Dense(4, activation="tanh", name="hidden", dtype=F64),
            keras.layers.Dense(2, name="out", dtype=F64),
        ],
        name="seq",
    )

    def split(x):
        hidden = model.get_layer("hidden")(x)
        return {"hidden": hidden}, lambda h: {"out": model.get_layer("out")(h)}

    return model, None, split


def _functional():
    inputs = keras.Input((3,), dtype=F64)
    t = keras.layers.Dense(4, name="d1", dtype=F64)(inputs)
    total = keras.ops.add(keras.ops.sin(t), keras.ops.cos(t))
    outputs = keras.layers.Dense(2, name="d2", dtype=F64)(total)
    model = keras.Model(inputs, outputs, name="sincos")

    def split(x):
        t = model.get_layer("d1")(x)

        def rest(t):
            s, c = tf.sin(t), tf.cos(t)
            total = s + c
            return {"sin": s, "cos": c, "add": total, "d2": model.get_layer("d2")(total)}

        return {"d1": t}, rest

    return model, "all", split


class _Tapped(keras.Model):
    def __init__(self):
        super().__init__(name="tapped", dtype=F64)
        self.hidden = keras.layers.Dense(4, name="hidden", dtype=F64)
        self.head = keras.layers.Dense(2, name="head", dtype=F64)

    def call(self, x):
        squashed = kgrad.tap("squashed", keras.ops.tanh(self.hidden(x)) * 2.0)
        return self.head(squashed)


def _subclassed():
    model = _Tapped()

    def split(x):
        hidden = model.hidden(x)
        squashed = tf.tanh(hidden) * 2.0

        def rest(z):
            return {"head": model.head(z)}

        return {"hidden": hidden, "squashed": squashed}, rest

    return model, None, split


KINDS = {"sequential": _sequential, "functional": _functional, "subclassed": _subclassed}


def _manual(model, split, x, y):
    """Reference: a plain tape over the hand-split model, every tensor watched."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        first, rest = split(x)
        tape.watch(list(first.values()))
        last_first = list(first.values())[-1]
        later = rest(last_first)
        tape.watch(list(later.values()))
        prediction = list(later.values())[-1]
        loss = _loss(prediction, y)
    activations = {**first, **later}
    gradients = tape.gradient(loss, {"act": activations, "x": x, "w": model.trainable_variables})
    # `rest` maps the last hand-computed activation to the remaining ones.
    return activations, gradients, rest, list(first)[-1]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_gradient_matches_a_manual_tape_and_finite_differences(kind, mode):
    model, layers, split = KINDS[kind]()
    x = tf.random.normal((2, 3), dtype=F64)
    y = tf.random.normal((2, 2), dtype=F64)
    model(x)  # build, so that the reference below uses the same weights

    def probed(x, y):
        with kgrad.ProbeTape(model, layers=layers, watch_inputs=True) as tape:
            prediction = model(x)
            loss = _loss(prediction, y)
            # Available right after the forward pass, usable as a source.
            early = tape.activations
        first_name = next(iter(early))
        requested = tape.gradient(
            loss, {"w": model.trainable_variables, "early": early[first_name]}
        )
        probe = tape.probe
        return requested, probe.activations, probe.gradients, probe.input_gradient, prediction

    requested, activations, gradients, input_gradient, prediction = _compiled(probed, mode)(x, y)
    ref_activations, ref, rest, split_name = _manual(model, split, x, y)

    assert list(activations) == list(ref_activations)
    for name in ref_activations:
        np.testing.assert_allclose(activations[name], ref_activations[name], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gradients[name], ref["act"][name], rtol=1e-7, atol=1e-12)
    first_name = next(iter(ref_activations))
    np.testing.assert_allclose(requested["early"], ref["act"][first_name], rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(input_gradient, ref["x"], rtol=1e-7, atol=1e-12)
    for got, expected in zip(requested["w"], ref["w"]):
        np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(prediction, model(x), rtol=1e-9)

    # Finite differences: of the whole model in x, and of the rest of the
    # model in the activation where the hand split cuts it.
    fd_input = central_difference(lambda v: _loss(model(tf.constant(v)), y), x)
    np.testing.assert_allclose(input_gradient, fd_input, atol=1e-7)
    fd_activation = central_difference(
        lambda v: _loss(list(rest(tf.constant(v)).values())[-1], y),
        ref_activations[split_name],
    )
    np.testing.assert_allclose(gradients[split_name], fd_activation, atol=1e-7)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_first_call_builds_a_subclassed_model_inside_the_probe(mode):
    model = _Tapped()
    x = tf.random.normal((2, 3), dtype=F64)
    y = tf.zeros((2, 2), dtype=F64)

    def probed(x):
        with kgrad.ProbeTape(model) as tape:
            loss = _loss(model(x), y)
        tape.gradient(loss, model.trainable_variables)
        return tape.probe.gradients

    gradients = _compiled(probed, mode)(x)
    # Keras traces call() once to build the model: that trace is not captured.
    assert list(gradients) == ["hidden", "squashed", "head"]
    _, ref, _, _ = _manual(model, _subclassed_split(model), x, y)
    for name in gradients:
        np.testing.assert_allclose(gradients[name], ref["act"][name], rtol=1e-7)


def _subclassed_split(model):
    def split(x):
        hidden = model.hidden(x)
        return {"hidden": hidden, "squashed": tf.tanh(hidden) * 2.0}, (
            lambda z: {"head": model.head(z)}
        )

    return split


# --- inputs --------------------------------------------------------------------


def _two_input_model(dict_inputs):
    a = keras.Input((3,), name="a", dtype=F64)
    b = keras.Input((2,), name="b", dtype=F64)
    merged = keras.layers.Concatenate(name="merge", dtype=F64)([a, keras.ops.square(b)])
    outputs = keras.layers.Dense(2, name="out", dtype=F64)(merged)
    return keras.Model({"a": a, "b": b} if dict_inputs else [a, b], outputs)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dict_inputs", [True, False], ids=["dict", "list"])
def test_input_gradient_of_a_multi_input_model_has_the_input_structure(dict_inputs, mode):
    model = _two_input_model(dict_inputs)
    a = tf.random.normal((2, 3), dtype=F64)
    b = tf.random.normal((2, 2), dtype=F64)
    inputs = {"a": a, "b": b} if dict_inputs else [a, b]
    y = tf.random.normal((2, 2), dtype=F64)

    def probed(inputs):
        with kgrad.ProbeTape(model, watch_inputs=True) as tape:
            loss = _loss(model(inputs), y)
        tape.gradient(loss, model.trainable_variables)
        return tape.probe.input_gradient

    got = _compiled(probed, mode)(inputs)
    with tf.GradientTape() as tape:
        tape.watch([a, b])
        loss = _loss(model(inputs), y)
    ref_a, ref_b = tape.gradient(loss, [a, b])
    if dict_inputs:
        assert sorted(got) == ["a", "b"]
        got_a, got_b = got["a"], got["b"]
    else:
        assert isinstance(got, list) and len(got) == 2
        got_a, got_b = got
    np.testing.assert_allclose(got_a, ref_a, rtol=1e-9)
    np.testing.assert_allclose(got_b, ref_b, rtol=1e-9)
    # d/db of (Dense . square) is 2 b W_b: zero where b is zero.
    np.testing.assert_allclose(
        got_b,
        central_difference(
            lambda v: _loss(
                model({"a": a, "b": tf.constant(v)} if dict_inputs else [a, tf.constant(v)]), y
            ),
            b,
        ),
        atol=1e-7,
    )


def test_input_given_as_numpy_or_keyword_is_watched():
    model = _Tapped()
    x = np.random.default_rng(0).normal(size=(2, 3))
    y = tf.zeros((2, 2), dtype=F64)
    reference = None
    for call in (lambda: model(x), lambda: model(x=tf.constant(x))):
        with kgrad.ProbeTape(model, watch_inputs=True) as tape:
            loss = _loss(call(), y)
        tape.gradient(loss, model.trainable_variables)
        got = tape.probe.input_gradient
        assert got is not None and got.shape == (2, 3)
        reference = got if reference is None else reference
        np.testing.assert_allclose(got, reference, rtol=1e-12)
    fd = central_difference(lambda v: _loss(model(tf.constant(v)), y), x)
    np.testing.assert_allclose(reference, fd, atol=1e-7)


def test_inputs_are_not_watched_by_default():
    model, _, _ = _sequential()
    x = tf.ones((1, 3), dtype=F64)
    with kgrad.ProbeTape(model) as tape:
        loss = tf.reduce_sum(model(x))
    tape.gradient(loss, model.trainable_variables)
    assert tape.probe.input_gradient is None
    np.testing.assert_array_equal(tape.probe.input, x)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_predicate_selects_layers_when_they_run(mode):
    model = _Tapped()  # not built yet: weights appear during the first call
    x = tf.random.normal((2, 3), dtype=F64)

    def probed(x):
        selected = lambda layer: bool(layer.weights) and layer.name == "head"  # noqa: E731
        with kgrad.ProbeTape(model, layers=selected) as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        tape.gradient(loss, model.trainable_variables)
        return tape.probe.gradients

    gradients = _compiled(probed, mode)(x)
    assert list(gradients) == ["squashed", "head"]  # the tap, and the one layer
    np.testing.assert_allclose(gradients["head"], 2.0 * model(x), rtol=1e-9)


# --- nested models, shared layers, selection ---------------------------------


def _nested_model():
    inner = keras.Sequential(
        [
            keras.Input((3,), dtype=F64),
            keras.layers.Dense(2, activation="tanh", name="idense", dtype=F64),
        ],
        name="inner",
    )
    inputs = keras.Input((3,), dtype=F64)
    outputs = keras.layers.Dense(1, name="head", dtype=F64)(inner(inputs))
    return keras.Model(inputs, outputs, name="outer"), inner


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("request_name", ["inner/idense", "idense", "object"])
def test_layer_of_a_nested_model(request_name, mode):
    model, inner = _nested_model()
    layer = inner.get_layer("idense")
    x = tf.random.normal((2, 3), dtype=F64)
    requested = [layer if request_name == "object" else request_name, "inner"]

    def probed(x):
        with kgrad.ProbeTape(model, layers=requested) as tape:
            loss = tf.reduce_sum(tf.sin(model(x)))
        tape.gradient(loss, model.trainable_variables)
        return tape.probe.gradients

    gradients = _compiled(probed, mode)(x)
    with tf.GradientTape() as tape:
        hidden = layer(x)
        tape.watch(hidden)
        loss = tf.reduce_sum(tf.sin(model.get_layer("head")(hidden)))
    expected = tape.gradient(loss, hidden)
    assert list(gradients) == ["idense", "inner"]
    # The inner model's output is its Dense output: same gradient.
    np.testing.assert_allclose(gradients["idense"], expected, rtol=1e-9)
    np.testing.assert_allclose(gradients["inner"], expected, rtol=1e-9)


@pytest.mark.parametrize("mode", MODES)
def test_shared_layer_is_captured_once_per_call(mode):
    shared = keras.layers.Dense(3, activation="tanh", name="shared", dtype=F64)
    inputs = keras.Input((3,), dtype=F64)
    model = keras.Model(inputs, shared(shared(inputs)))
    x = tf.random.normal((2, 3), dtype=F64)

    def probed(x):
        with kgrad.ProbeTape(model, layers=["shared"]) as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        tape.gradient(loss, model.trainable_variables)
        return tape.probe.activations, tape.probe.gradients

    activations, gradients = _compiled(probed, mode)(x)
    with tf.GradientTape() as tape:
        first = shared(x)
        tape.watch(first)
        second = shared(first)
        tape.watch(second)
        loss = tf.reduce_sum(second**2)
    expected = tape.gradient(loss, [first, second])
    assert list(gradients) == ["shared", "shared#2"]
    np.testing.assert_allclose(activations["shared"], first, rtol=1e-9)
    np.testing.assert_allclose(activations["shared#2"], second, rtol=1e-9)
    np.testing.assert_allclose(gradients["shared"], expected[0], rtol=1e-9)
    np.testing.assert_allclose(gradients["shared#2"], expected[1], rtol=1e-9)


def test_a_tap_called_twice_is_captured_once_per_call():
    class Twice(keras.Model):
        def __init__(self):
            super().__init__(dtype=F64)
            self.dense = keras.layers.Dense(3, dtype=F64)

        def call(self, x):
            return kgrad.tap("z", self.dense(kgrad.tap("z", x * 3.0)))

    model = Twice()
    x = tf.random.normal((2, 3), dtype=F64)
    with kgrad.ProbeTape(model, layers=[]) as tape:
        loss = tf.reduce_sum(model(x))
    tape.gradient(loss, model.trainable_variables)
    kernel = model.dense.kernel.numpy()
    assert list(tape.probe.gradients) == ["z", "z#2"]
    # d sum(z W + b) / dz = row sums of W; d sum(...) / d z#2 = 1.
    np.testing.assert_allclose(
        tape.probe.gradients["z"], np.tile(kernel.sum(1), (2, 1)), rtol=1e-12
    )
    np.testing.assert_allclose(tape.probe.gradients["z#2"], np.ones((2, 3)), rtol=1e-12)


def test_activations_the_loss_does_not_use_get_zero_gradients():
    inputs = keras.Input((3,))
    used = keras.layers.Dense(2, name="used")(inputs)
    unused = keras.layers.Dense(4, name="unused")(inputs)
    model = keras.Model(inputs, [used, unused])
    with kgrad.ProbeTape(model) as tape:
        loss = tf.reduce_sum(model(tf.ones((2, 3)))[0])
    tape.gradient(loss, model.trainable_variables)
    np.testing.assert_array_equal(tape.probe.gradients["unused"], np.zeros((2, 4)))
    np.testing.assert_array_equal(tape.probe.gradients["used"], np.ones((2, 2)))


# --- persistence -----------------------------------------------------------------


def test_non_persistent_tape_allows_exactly_one_gradient_call():
    model, _, _ = _sequential()
    with kgrad.ProbeTape(model) as tape:
        loss = tf.reduce_sum(model(tf.ones((1, 3), dtype=F64)))
    tape.gradient(loss, model.trainable_variables)
    with pytest.raises(RuntimeError, match="non-persistent GradientTape"):
        tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("mode", ["eager", "xla"])
def test_persistent_tape_answers_twice_and_probe_follows_the_latest_call(mode):
    model, _, _ = _sequential()
    x = tf.random.normal((2, 3), dtype=F64)

    def probed(x):
        with kgrad.ProbeTape(model, persistent=True, watch_inputs=True) as tape:
            loss = tf.reduce_sum(model(x) ** 2)
            tripled = 3.0 * loss
        first_weights = tape.gradient(loss, model.trainable_variables)
        first = tape.probe
        second_weights = tape.gradient(tripled, model.trainable_variables)
        second = tape.probe
        return (
            first_weights,
            second_weights,
            first.gradients,
            second.gradients,
            (first.input_gradient, second.input_gradient),
        )

    first_w, second_w, first, second, inputs = _compiled(probed, mode)(x)
    for a, b in zip(first_w, second_w):
        np.testing.assert_allclose(3.0 * a, b, rtol=1e-12)
    for name in ("hidden", "out"):
        np.testing.assert_allclose(3.0 * first[name], second[name], rtol=1e-12)
    np.testing.assert_allclose(3.0 * inputs[0], inputs[1], rtol=1e-12)


# --- errors --------------------------------------------------------------------


def test_probe_read_before_gradient_raises():
    model, _, _ = _sequential()
    with kgrad.ProbeTape(model) as tape:
        model(tf.ones((1, 3), dtype=F64))
    with pytest.raises(
        RuntimeError, match=r"`tape\.probe` is only available after `tape\.gradient"
    ):
        _ = tape.probe


def test_probe_on_a_model_that_was_not_called_raises():
    model, _, _ = _sequential()
    other, _, _ = _functional()
    with kgrad.ProbeTape(model) as tape:
        loss = tf.reduce_sum(other(tf.ones((1, 3), dtype=F64)))
    with pytest.raises(
        ValueError,
        match=r"`model` was never called.*Received: model='seq'.*"
        r"open the ProbeTape on the model you call",
    ):
        tape.gradient(loss, other.trainable_variables)


@pytest.mark.filterwarnings("ignore:`build\\(\\)` was called on layer")
def test_layer_never_called_in_the_forward_pass_raises():
    class Skips(keras.Model):
        def __init__(self):
            super().__init__()
            self.used = keras.layers.Dense(2, name="used")
            self.spare = keras.layers.Dense(2, name="spare")

        def call(self, x):
            return self.used(x)

    model = Skips()
    model(tf.ones((1, 3)))
    with kgrad.ProbeTape(model, layers=["used", "spare"]) as tape:
        loss = tf.reduce_sum(model(tf.ones((1, 3))))
    with pytest.raises(
        ValueError, match=r"'spare', which was never called.*Received: layers=\['used', 'spare'\]"
    ):
        tape.gradient(loss, model.trainable_variables)


def test_input_gradient_of_integer_inputs_raises_and_names_the_embedding():
    model = keras.Sequential(
        [
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(10, 3, name="tokens"),
            keras.layers.Dense(1),
        ]
    )
    with pytest.raises(
        ValueError,
        match=r"`watch_inputs=True`.*Received: input dtypes \['int32'\].*layers=\['tokens'\]",
    ):
        with kgrad.ProbeTape(model, watch_inputs=True):
            model(tf.zeros((2, 4), tf.int32))
    # The suggested fix works: dJ/d(embedding output).
    with kgrad.ProbeTape(model, layers=["tokens"]) as tape:
        loss = tf.reduce_sum(model(tf.zeros((2, 4), tf.int32)))
    tape.gradient(loss, model.trainable_variables)
    assert tape.probe.gradients["tokens"].shape == (2, 4, 3)


def test_layer_without_float_output_raises():
    class ArgMax(keras.layers.Layer):
        def call(self, x):
            return keras.ops.argmax(x, axis=-1)

    inputs = keras.Input((3,))
    scores = keras.layers.Dense(3, name="scores")(inputs)
    model = keras.Model(inputs, [scores, ArgMax(name="argmax")(scores)])
    with kgrad.ProbeTape(model, layers=["argmax"]) as tape:
        loss = tf.reduce_sum(model(tf.ones((1, 3)))[0])
    with pytest.raises(
        ValueError,
        match=r"'argmax', which produced no floating-point output "
        r"\(output dtypes: \['int(32|64)'\]\).*Received: layers=\['argmax'\]",
    ):
        tape.gradient(loss, model.trainable_variables)


def test_layer_run_only_inside_a_traced_loop_raises():
    class PerExample(keras.layers.Layer):
        """Runs a Dense layer on each example in turn, inside tf.map_fn."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dense(2, name="inner")

        def call(self, x):
            return tf.map_fn(self.inner, x)

    model = keras.Sequential([keras.Input((4, 3)), PerExample(name="per_example")])
    model(tf.ones((1, 4, 3)))  # builds `inner` outside the loop

    @tf.function
    def probed(x):
        with kgrad.ProbeTape(model, layers=["inner"]) as tape:
            loss = tf.reduce_sum(model(x))
        tape.gradient(loss, model.trainable_variables)

    with pytest.raises(
        ValueError,
        match=r"'inner', which ran inside a loop.*Probe the layer that runs the loop",
    ):
        probed(tf.ones((2, 4, 3)))


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_naming_the_cell_of_a_recurrent_layer_raises(mode):
    # Eagerly every call of the cell is recorded, and the first (Keras' shape
    # probe on time step 0, discarded) has dJ/d(output) = 0: no call of the
    # cell is its gradient, in either mode.
    model = keras.Sequential([keras.Input((4, 3)), keras.layers.LSTM(2, name="lstm")])

    def probed(x):
        with kgrad.ProbeTape(model, layers=["lstm_cell"]) as tape:
            loss = tf.reduce_sum(model(x))
        tape.gradient(loss, model.trainable_variables)

    with pytest.raises(
        ValueError,
        match=r"`layers` asks for layer 'lstm_cell', which runs inside the time loop of "
        r"recurrent layer 'lstm'.*Received: layers=\['lstm_cell'\]\. Probe 'lstm' instead",
    ):
        _compiled(probed, mode)(tf.ones((1, 4, 3)))


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("layers", ["all", lambda layer: True])
def test_every_layer_leaves_out_the_cells_of_recurrent_layers(mode, layers):
    inputs = keras.Input((4, 3))
    both_ways = keras.layers.Bidirectional(
        keras.layers.GRU(2, return_sequences=True), name="both_ways"
    )(inputs)
    last = keras.layers.LSTM(2, name="lstm")(both_ways)
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(last))
    x = tf.random.normal((2, 4, 3), seed=1)

    def probed(x):
        with kgrad.ProbeTape(model, layers=layers) as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        tape.gradient(loss, model.trainable_variables)
        return tape.probe.gradients

    gradients = _compiled(probed, mode)(x)
    assert not [name for name in gradients if "cell" in name]
    assert {"both_ways", "forward_gru", "backward_gru", "lstm", "out"} <= set(gradients)
    with tf.GradientTape() as tape:
        hidden = model.get_layer("both_ways")(x)
        tape.watch(hidden)
        last = model.get_layer("lstm")(hidden)
        tape.watch(last)
        loss = tf.reduce_sum(model.get_layer("out")(last) ** 2)
    expected = tape.gradient(loss, [hidden, last])
    np.testing.assert_allclose(gradients["both_ways"], expected[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gradients["lstm"], expected[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_recurrent_layer_gradient_matches_a_manual_tape(mode):
    model = keras.Sequential(
        [keras.Input((4, 3)), keras.layers.LSTM(2, name="lstm"), keras.layers.Dense(1, name="out")]
    )
    x = tf.random.normal((2, 4, 3))

    def probed(x):
        with kgrad.ProbeTape(model) as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        tape.gradient(loss, model.trainable_variables)
        return tape.probe.gradients

    gradients = _compiled(probed, mode)(x)
    with tf.GradientTape() as tape:
        hidden = model.get_layer("lstm")(x)
        tape.watch(hidden)
        loss = tf.reduce_sum(model.get_layer("out")(hidden) ** 2)
    assert list(gradients) == ["lstm", "out"]
    np.testing.assert_allclose(gradients["lstm"], tape.gradient(loss, hidden), rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (
            {"model": "net"},
            TypeError,
            r"`model` must be a keras\.Model\. Received: model='net' of type str",
        ),
        (
            {"watch_inputs": 1},
            TypeError,
            r"`watch_inputs` must be True or False.*Received: watch_inputs=1",
        ),
        (
            {"layers": "hidden"},
            TypeError,
            r"Received: layers='hidden'\. Pass a list, e\.g\. layers=\['hidden'\]",
        ),
        (
            {"layers": ["hiden"]},
            ValueError,
            r"does not have: 'hiden'.*available names: 'hidden', 'out'",
        ),
    ],
)
def test_bad_arguments_raise(kwargs, error, pattern):
    model, _, _ = _sequential()
    arguments = {"model": model, **kwargs}
    with pytest.raises(error, match=pattern):
        kgrad.ProbeTape(**arguments)
