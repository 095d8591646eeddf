"""Interception of layer / op outputs (`capture.taps`), `kgrad.tap` and layer selection."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from kgrad.plan import operations
from kgrad.plan import selection
from kgrad.backends.tensorflow.capture import taps


@pytest.fixture(autouse=True)
def _fresh_names():
    # Keras numbers op names ("sin", "sin_1"...) per session.
    keras.backend.clear_session(free_memory=False)


def _sin_cos_model():
    inputs = keras.Input((3,), name="x")
    t = keras.layers.Dense(4, name="d1")(inputs)
    total = keras.ops.add(keras.ops.sin(t), keras.ops.cos(t))
    outputs = keras.layers.Dense(1, name="d2")(total)
    return keras.Model(inputs, outputs, name="sincos")


def _nested_model():
    inner = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(2, name="idense")], name="inner"
    )
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(1, name="head")(inner(inputs))
    return keras.Model(inputs, outputs, name="outer")


def _every_operation(model):
    return (
        [model]
        + list(model._flatten_layers(include_self=False, recursive=True))
        + [op for op in getattr(model, "operations", []) if not isinstance(op, keras.layers.Layer)]
    )


def _instance_calls(model):
    return [op.name for op in _every_operation(model) if "call" in op.__dict__]


# --- kgrad.tap ----------------------------------------------------------------


def test_tap_without_probe_returns_the_same_object_and_records_nothing():
    x = tf.constant([1.0, 2.0])
    assert kgrad.tap("hidden", x) is x
    nested = {"a": x, "b": [x]}
    assert kgrad.tap("nested", nested) is nested
    assert taps.active_recorder() is None


def test_tap_before_and_after_a_probe_is_not_recorded_by_it():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    x = tf.ones((1, 2))
    kgrad.tap("before", x)
    with kgrad.ProbeTape(model) as tape:
        kgrad.tap("during", model(x))
    kgrad.tap("after", x)
    assert list(tape.activations) == ["out", "during"]
    assert taps.active_recorder() is None


def test_tap_is_free_inside_a_compiled_function_without_probe():
    @tf.function(jit_compile=True)
    def double(x):
        return kgrad.tap("doubled", x * 2.0)

    np.testing.assert_allclose(double(tf.constant([1.5])).numpy(), [3.0])


@pytest.mark.parametrize("name", ["", None, 3, ("a",)])
def test_tap_rejects_a_bad_name(name):
    with pytest.raises(TypeError, match=r"`name` must be a non-empty string.*Received: name="):
        kgrad.tap(name, tf.ones(2))


# --- which names a model offers -----------------------------------------------


def test_functional_non_layer_operations_are_tappable_by_name():
    names = list(operations.tappable_operations(_sin_cos_model()))
    assert names == ["d1", "sin", "cos", "add", "d2"]


def test_nested_layers_are_reachable_by_path_and_by_unique_plain_name():
    model = _nested_model()
    named = operations.tappable_operations(model)
    assert set(named) == {"inner", "inner/idense", "idense", "head"}
    assert named["inner/idense"] is named["idense"] is model.get_layer("inner").get_layer("idense")


def test_ambiguous_plain_names_are_reachable_by_path_only():
    def inner(name):
        return keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="dense")], name=name)

    inputs = keras.Input((2,))
    model = keras.Model(inputs, inner("left")(inputs) + inner("right")(inputs))
    named = operations.tappable_operations(model)
    assert "dense" not in named
    assert named["left/dense"] is not named["right/dense"]
    selected = selection.resolve_layers(model, ["left/dense", "right/dense"])
    assert list(selected) == ["left/dense", "right/dense"]


# --- layer selection ----------------------------------------------------------


def test_default_selection_is_leaf_layers_with_weights():
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, name="dense")(inputs)
    hidden = keras.layers.BatchNormalization(name="norm")(hidden)
    hidden = keras.layers.Dropout(0.5, name="drop")(keras.ops.sin(hidden))
    inner = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(2, name="inner_dense")], name="inner"
    )
    model = keras.Model(inputs, inner(hidden))
    assert list(selection.resolve_layers(model, None)) == ["dense", "norm", "inner_dense"]


def test_default_selection_takes_a_recurrent_layer_not_its_cell():
    model = keras.Sequential(
        [keras.Input((4, 3)), keras.layers.LSTM(2, name="lstm"), keras.layers.Dense(1, name="out")]
    )
    assert list(selection.resolve_layers(model, None)) == ["lstm", "out"]
    assert "lstm_cell" in operations.tappable_operations(model)


def test_all_selects_every_layer_and_operation():
    assert list(selection.resolve_layers(_sin_cos_model(), "all")) == [
        "d1",
        "sin",
        "cos",
        "add",
        "d2",
    ]


def test_layer_objects_and_predicates_select_the_same_as_names():
    model = _sin_cos_model()
    by_name = selection.resolve_layers(model, ["d2", "sin"])
    by_object = selection.resolve_layers(model, [model.get_layer("d2"), model.operations[2]])
    by_predicate = selection.resolve_layers(model, lambda op: op.name in ("d2", "sin"))
    assert list(by_name) == list(by_object) == ["d2", "sin"]
    assert list(by_predicate) == ["sin", "d2"]  # the model's own order
    assert all(by_name[k] is by_object[k] is by_predicate[k] for k in by_name)


def test_nested_layer_is_reported_under_its_plain_name_whichever_way_it_is_named():
    model = _nested_model()
    layer = model.get_layer("inner").get_layer("idense")
    for request in (["inner/idense"], ["idense"], [layer]):
        assert selection.resolve_layers(model, request) == {"idense": layer}


def test_unknown_name_lists_available_names():
    with pytest.raises(
        ValueError,
        match=r"does not have: 'nope'\. Received: layers=\['nope'\]\. "
        r"Use one of the available names: 'add', 'cos', 'd1', 'd2', 'sin'\.",
    ):
        selection.resolve_layers(_sin_cos_model(), ["nope"])


def test_layer_of_another_model_is_rejected():
    with pytest.raises(
        ValueError, match=r"'stranger'.*not part of model 'sincos'.*Received: layers="
    ):
        selection.resolve_layers(_sin_cos_model(), [keras.layers.Dense(1, name="stranger")])


def test_layer_listed_twice_is_rejected():
    model = _nested_model()
    with pytest.raises(ValueError, match=r"lists layer 'idense' twice.*List each layer once"):
        selection.resolve_layers(model, ["idense", "inner/idense"])


@pytest.mark.parametrize(
    "layers, pattern",
    [
        ("d1", r"Received: layers='d1'\. Pass a list, e\.g\. layers=\['d1'\]"),
        (3, r"Received: layers=3\. Pass a list"),
        ([3.5], r"Received: layers=\[3\.5\], whose item 3\.5 is of type float"),
    ],
)
def test_bad_layers_argument_types(layers, pattern):
    with pytest.raises(TypeError, match=pattern):
        selection.resolve_layers(_sin_cos_model(), layers)


# --- interception: outputs unchanged, layers restored ------------------------


def test_intercepted_outputs_are_the_very_tensors_keras_returns():
    model = _sin_cos_model()
    x = tf.random.normal((2, 3))
    expected = model(x)
    with kgrad.ProbeTape(model, layers="all") as tape:
        prediction = model(x)
    np.testing.assert_array_equal(prediction.numpy(), expected.numpy())
    # Identity, not a copy: Keras attaches `_keras_logits` / masks to outputs.
    assert tape.activations["d2"] is prediction


def test_training_argument_still_reaches_wrapped_layers():
    model = keras.Sequential(
        [keras.Input((200,)), keras.layers.Dropout(0.5, name="drop"), keras.layers.Dense(1)]
    )
    x = tf.ones((1, 200))
    with kgrad.ProbeTape(model, layers=["drop"]) as tape:
        model(x, training=True)
        dropped = tape.activations["drop"].numpy()
    # Dropout in training mode zeroes some units and scales the rest by 2.
    assert set(np.unique(dropped)) == {0.0, 2.0}
    with kgrad.ProbeTape(model, layers=["drop"]) as tape:
        model(x, training=False)
    np.testing.assert_array_equal(tape.activations["drop"].numpy(), x.numpy())


@pytest.mark.parametrize("build_model", [_sin_cos_model, _nested_model])
def test_layers_are_restored_after_the_block(build_model):
    model = build_model()
    assert _instance_calls(model) == []
    with kgrad.ProbeTape(model, layers="all"):
        assert _instance_calls(model) != []
        model(tf.ones((1, 3)))
    assert _instance_calls(model) == []


def test_layers_are_restored_when_the_forward_pass_raises():
    model = _sin_cos_model()
    with pytest.raises(ValueError):
        with kgrad.ProbeTape(model, layers="all"):
            model(tf.ones((1, 5)))  # wrong feature size
    assert _instance_calls(model) == []
    assert taps.active_recorder() is None
    # The model still works, and a later probe still sees every layer.
    with kgrad.ProbeTape(model, layers="all") as tape:
        model(tf.ones((1, 3)))
    assert list(tape.activations) == ["d1", "sin", "cos", "add", "d2"]


def test_a_call_set_on_the_instance_before_probing_is_put_back():
    model = _sin_cos_model()
    layer = model.get_layer("d1")
    original = layer.call

    def own_call(*args, **kwargs):
        return original(*args, **kwargs) + 1.0

    layer.call = own_call
    with kgrad.ProbeTape(model, layers=["d1"]) as tape:
        model(tf.zeros((1, 3)))
    assert layer.__dict__["call"] is own_call
    # The user's call ran inside the probe: zero input gives bias + 1 = 1.
    np.testing.assert_allclose(tape.activations["d1"].numpy(), np.ones((1, 4)))


def test_nested_probes_restore_in_order():
    model = _sin_cos_model()
    with kgrad.ProbeTape(model, layers=["d1"]) as outer:
        with kgrad.ProbeTape(model, layers=["d1", "d2"]) as inner:
            model(tf.ones((1, 3)))
        assert _instance_calls(model) == ["sincos", "d1"]
    assert _instance_calls(model) == []
    assert list(inner.activations) == ["d1", "d2"]
    assert list(outer.activations) == ["d1"]
