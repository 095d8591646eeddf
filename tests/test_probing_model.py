"""ProbingModel: built functionally or subclassed, trained, saved and loaded.

Backend-free (Keras and NumPy): tests/jax/test_probing_model_jax.py runs these tests on JAX,
beside the JAX values checked against ``jax.grad``.
"""

import re

import keras
from keras.src.models.functional import Functional
import numpy as np
import pytest

import kgrad
from fit_helpers import (
    CLASSES,
    RecordCollector,
    assert_finite_record,
    classification_data,
    compile_classifier,
    functional_classifier,
)


@keras.saving.register_keras_serializable(package="kgrad_tests")
class SimpleModel(kgrad.ProbingModel):
    """The subclassed form of the issue: ``class SimpleModel(kgrad.ProbingModel)``."""

    def __init__(self, units=8, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="relu", name="hidden")
        self.out = keras.layers.Dense(CLASSES, activation="softmax", name="out")

    def call(self, inputs):
        return self.out(self.hidden(inputs))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable(package="kgrad_tests")
class FunctionalSubclass(kgrad.ProbingModel):
    """A user subclass of ProbingModel that is built functionally."""


def test_functional_probing_model_probes_every_step_by_default():
    x, y = classification_data(samples=16)
    model = compile_classifier(functional_classifier(kgrad.ProbingModel))
    assert isinstance(model, kgrad.ProbingModel)
    assert model.probe_results is None
    history = model.fit(x, y, batch_size=8, verbose=0)
    record = model.probe_results
    assert isinstance(record, kgrad.ProbeRecord)
    assert record.step == 1  # the second and last step
    assert_finite_record(record)
    expected = {"activation_zero_fraction/hidden", "grad_norm/out", "pred_grad_norm/output"}
    assert expected <= set(record.scalars)
    assert set(history.history) == {"loss", "accuracy"}


def test_configure_probe_selects_layers_captures_and_schedule():
    x, y = classification_data()
    model = compile_classifier(functional_classifier(kgrad.ProbingModel))
    model.configure_probe(
        layers=["hidden"], every_n_steps=3, capture=["activations"], histograms=False, statistics="all"
    )
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    record = model.probe_results
    assert record.step == 6
    stats = ("norm", "mean", "std", "min", "max", "zero_fraction", "nonfinite")
    # global/loss: the loss of every probed step, whatever is captured (the spikes' first signal).
    assert sorted(record.scalars) == sorted([f"activation_{stat}/hidden" for stat in stats] + ["global/loss"])
    assert record.histograms == {}
    # By default, activations write only their zero fraction.
    model.configure_probe(layers=["hidden"], every_n_steps=3, capture=["activations"])
    model.fit(x, y, batch_size=8, verbose=0)
    assert sorted(model.probe_results.scalars) == ["activation_zero_fraction/hidden", "global/loss"]
    assert model.probe_results.histograms == {}


def test_configure_probe_rejects_bad_options():
    model = functional_classifier(kgrad.ProbingModel)
    with pytest.raises(ValueError, match=re.escape("Received: every_n_steps=0")):
        model.configure_probe(every_n_steps=0)
    with pytest.raises(ValueError, match=re.escape("unknown kinds ['weights']")):
        model.configure_probe(capture=["weights"])


def test_subclassing_still_works_after_a_functional_probing_model_exists():
    # Regression: Keras used to rewrite ProbingModel's bases to include
    # Functional when ProbingModel(inputs, outputs) was first called, and
    # every later `class X(kgrad.ProbingModel)` failed in __init__.
    functional_classifier(kgrad.ProbingModel)
    FunctionalSubclass(*_graph())
    assert keras.Model in kgrad.ProbingModel.__bases__
    assert not issubclass(kgrad.ProbingModel, Functional)  # its bases were not rewritten
    x, y = classification_data(samples=16)
    model = compile_classifier(SimpleModel())
    model.configure_probe(histograms=False)
    assert model.probe_results is None  # nothing probed yet
    model.fit(x, y, batch_size=8, verbose=0)
    assert model.probe_results.step == 1
    scalars = set(model.probe_results.scalars)
    assert {"activation_zero_fraction/hidden", "weight_grad_norm/hidden/kernel"} <= scalars


def _graph():
    inputs = keras.Input((4,), name="features")
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="out")(inputs)
    return inputs, outputs


def _assert_round_trip(model, path, x, y):
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is type(model)
    # The saved compile config has no jit_compile: Keras' "auto" would use XLA.
    loaded.jit_compile = False
    loaded.configure_probe(histograms=False)
    assert not [w.path for w in loaded.weights if "kgrad" in w.path]
    assert len(loaded.weights) == len(model.weights)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    # The loaded model trains on from the saved optimizer state, and probes.
    loaded.fit(x, y, batch_size=len(x), verbose=0)
    assert loaded.probe_results.step == int(model.optimizer.iterations)
    return loaded


@pytest.mark.parametrize(
    "build",
    [
        lambda: functional_classifier(kgrad.ProbingModel),
        lambda: FunctionalSubclass(*_graph()),
        lambda: SimpleModel(units=6),
    ],
    ids=["functional", "functional-subclass", "subclassed"],
)
def test_save_and_load_model(build, tmp_path):
    x, y = classification_data(samples=16)
    model = compile_classifier(build())
    model.configure_probe(histograms=False)
    model.fit(x, y, batch_size=8, verbose=0)
    loaded = _assert_round_trip(model, tmp_path / "model.keras", x, y)
    assert isinstance(loaded, kgrad.ProbingModel)
    if isinstance(model, SimpleModel):
        assert loaded.units == 6


def test_gradient_probe_on_a_probing_model_then_its_own_probe_again(tmp_path):
    x, y = classification_data()
    model = compile_classifier(functional_classifier(kgrad.ProbingModel))
    model.configure_probe(layers=["out"], every_n_steps=1, histograms=False)
    # TensorFlow's ProbingModel keeps its probed step; JAX's builds it in its train function.
    own_step = model._probing_step() if keras.config.backend() == "tensorflow" else None
    collector = RecordCollector()
    probe = kgrad.GradientProbe(tmp_path, layers=["hidden"], every_n_steps=2, histograms=False,
                                on_probe=collector)
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[probe])
    assert collector.steps == [0, 2]
    assert "activation_zero_fraction/hidden" in probe.latest.scalars
    assert "activation_zero_fraction/out" not in probe.latest.scalars
    written = kgrad.read_logs(tmp_path)["kgrad"]["scalars"]
    assert written["grad_norm/hidden"].steps.tolist() == [0, 2]
    assert "grad_norm/out" not in written

    # After the probed fit, the model's own probe and configuration are back.
    if own_step is not None:
        assert model._probing_step() is own_step
    model.fit(x, y, batch_size=8, verbose=0)
    assert model.probe_results.step == 7
    assert "activation_zero_fraction/out" in model.probe_results.scalars
    assert "activation_zero_fraction/hidden" not in model.probe_results.scalars
