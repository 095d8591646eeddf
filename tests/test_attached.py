"""The registry of what kgrad keeps on a user's objects (`kgrad.backends.common.attached`)."""

import gc
import weakref

import keras
import pytest

from kgrad.backends.common import attached


def _model():
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])


def test_entries_stay_out_of_keras_tracking_and_leave_no_attribute_when_popped():
    model = _model()
    weights_before = [w.path for w in model.weights]
    attached.put(model, "probing_step", keras.Variable([1.0]))  # a variable Keras would track
    assert attached.names(model) == ["probing_step"]
    assert [w.path for w in model.weights] == weights_before
    assert attached.setdefault(model, "kept_train_functions", []) == []
    attached.get(model, "kept_train_functions").append("f")
    assert attached.pop(model, "kept_train_functions") == ["f"]
    attached.pop(model, "probing_step")
    assert attached.names(model) == [] and attached.ATTRIBUTE not in vars(model)
    assert attached.pop(model, "probing_step", "none") == "none"


class _Owner:
    """A user's object, as far as the registry is concerned: one with a ``__dict__``."""


def test_an_entry_that_refers_to_its_owner_does_not_keep_it_alive():
    # Automatic collections off: the cycle stays in the youngest generation, so
    # collecting that one (fast, unlike a full collection of TensorFlow's heap) frees it.
    gc.disable()
    try:
        owner = _Owner()
        attached.put(owner, "installation", {"owner": owner})
        gone = weakref.ref(owner)
        del owner
        assert gone() is not None  # a cycle: reference counting alone does not free it
        gc.collect(0)
        assert gone() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("call", [
    lambda model: attached.get(model, "instalation"),
    lambda model: attached.put(model, "instalation", 1),
    lambda model: attached.pop(model, "instalation"),
])
def test_an_unknown_entry_is_refused_naming_the_known_ones(call):
    with pytest.raises(KeyError, match=r"'instalation' is not an entry of .*KEYS.*Known: installation"):
        call(_model())
