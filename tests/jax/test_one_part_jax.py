"""Keras' own JAX ``train_step`` is the model's step with one differentiated part.

The guide model (its own ``train_step``, one ``kgrad.value_and_grad``) and the
same layers on Keras' own ``train_step`` go through one probe and one guard.
What they write differs only where the part's role says it does
(docs/architecture.md, the seven settled differences): Keras' step is logged
under the model's own run, taps the input (``input_grad_*``), writes
``global/loss``, and its guard rows carry no part name; every other tag and
every value is the same, and so is the training, probed and guarded.
"""

import keras
import numpy as np
import pytest

import kgrad
from guide_model import GuideModel

BATCH, STEPS, FEATURES = 8, 3, 3


def _model(own_step, optimizer="adam"):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(4, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(1, name="out")(hidden)
    model = (GuideModel if own_step else keras.Model)(inputs, outputs, name="guide")
    model.compile(keras.optimizers.Adam(0.05, clipnorm=0.01) if optimizer == "adam" else optimizer, "mse")
    return model


def _data():
    rng = np.random.default_rng(1)
    return (rng.normal(size=(BATCH * STEPS, FEATURES)).astype("float32"),
            rng.normal(size=(BATCH * STEPS, 1)).astype("float32"))


def _probed(own_step, tmp_path, guard):
    x, y = _data()
    model, records = _model(own_step), []
    initial = model.get_weights()
    probe = kgrad.GradientProbe(str(tmp_path / str(own_step)), every_n_steps=2, statistics="all",
                                instruments=["optimizer"], on_probe=records.append)
    callbacks = [probe] + ([kgrad.NonFiniteGuard()] if guard else [])
    history = model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=callbacks)
    if not own_step:  # global/loss of the first step: the loss of the first batch, from the weights in NumPy
        kernel1, bias1, kernel2, bias2 = (w.astype(np.float64) for w in initial)
        out = np.maximum(x[:BATCH] @ kernel1 + bias1, 0) @ kernel2 + bias2
        assert records[0].scalars["global/loss"] == pytest.approx(np.mean((out - y[:BATCH]) ** 2), rel=1e-5)
    return records, model.get_weights(), history.history["loss"]


@pytest.mark.parametrize("guard", [False, True])
def test_keras_step_and_an_own_step_with_one_part_write_the_same_but_what_the_role_sets(tmp_path, guard):
    keras_records, keras_weights, keras_loss = _probed(False, tmp_path, guard)
    own_records, own_weights, own_loss = _probed(True, tmp_path, guard)
    assert [(r.step, r.tape) for r in keras_records] == [(0, None), (2, None)]
    assert [(r.step, r.tape) for r in own_records] == [(0, "guide"), (2, "guide")]
    for keras_record, own_record in zip(keras_records, own_records, strict=True):
        only_keras = set(keras_record.scalars) - set(own_record.scalars)
        input_gradients = {t for t in keras_record.scalars if t.startswith("input_grad_")}
        assert only_keras == {"global/loss"} | input_gradients
        assert any(t.startswith("input_grad_") for t in only_keras)
        assert set(own_record.scalars) <= set(keras_record.scalars)
        # The optimizer instrument of both reads the gradients as Adam applied them (clipped).
        assert any(t.startswith("adam_rms/") for t in own_record.scalars)
        for tag, value in own_record.scalars.items():
            assert keras_record.scalars[tag] == pytest.approx(value, rel=1e-5, abs=1e-7), tag
    for keras_weight, own_weight in zip(keras_weights, own_weights, strict=True):
        np.testing.assert_allclose(keras_weight, own_weight, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(keras_loss, own_loss, rtol=1e-6)


def _tripped_report(own_step):
    x, y = _data()
    y[BATCH + 1, 0] = np.inf  # the second step's batch: the loss and every gradient after it
    model = _model(own_step, optimizer="sgd")
    guard = kgrad.NonFiniteGuard(watch="all", replay=False)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[guard])
    return guard.report


def test_the_guard_names_keras_steps_rows_without_a_part_and_an_own_steps_inside_its_part():
    keras_report, own_report = _tripped_report(False), _tripped_report(True)
    assert keras_report.step == own_report.step == 1
    assert "loss/loss" in keras_report.non_finite and "grad/hidden" in keras_report.non_finite
    in_part = {}
    for name, counts in keras_report.non_finite.items():
        kind, _, rest = name.partition("/")
        in_part["loss/guide" if name == "loss/loss" else f"{kind}/guide/{rest}"] = counts
    assert own_report.non_finite == in_part
