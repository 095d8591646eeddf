"""A later ``fit`` with the same options reuses the traced probing step.

Tracing the probing step takes seconds (a minute for a MobileNet); users who
call ``fit`` in a loop must not pay it every time. The kept step must behave
exactly as a freshly traced one: same records, same training, fresh buffers.
"""

import numpy as np
import pytest

import kgrad
from kgrad.backends.common import attached
from fit_helpers import (
    RecordCollector,
    SubclassedClassifier,
    classification_data,
    compile_classifier,
    functional_classifier,
    sequential_classifier,
    weights_max_abs_difference,
)
from kgrad.backends.tensorflow.differentiate.step import ProbingStep

import keras


@pytest.fixture
def traces(monkeypatch):
    """The plans of the probing train_steps traced (run as Python), one entry per trace."""
    count = []
    original = ProbingStep.train_step

    def counting(self, data):
        count.append(self._running.plan)
        return original(self, data)

    monkeypatch.setattr(ProbingStep, "train_step", counting)
    return count


def _model(seed=3):
    keras.utils.set_random_seed(seed)
    return compile_classifier(functional_classifier())


def _fit(model, callbacks, epochs=1, data_seed=0):
    x, y = classification_data(samples=32, seed=data_seed)
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)


def _probe(collector, **options):
    return kgrad.GradientProbe(every_n_steps=options.pop("every_n_steps", 3), on_probe=collector, **options)


def test_second_fit_with_the_same_options_is_not_traced_again(traces):
    model = _model()
    _fit(model, [_probe(RecordCollector())])
    traced_once = len(traces)
    assert traced_once > 0
    second = RecordCollector()
    _fit(model, [_probe(second)], epochs=2)
    assert len(traces) == traced_once
    # The schedule restarts with the fit; steps are optimizer.iterations.
    assert second.steps == [4, 7, 10]


def test_kept_step_logs_and_trains_exactly_as_a_freshly_traced_one():
    kept, fresh = _model(), _model()
    _fit(kept, [_probe(RecordCollector())])
    _fit(fresh, [_probe(RecordCollector())])
    assert attached.pop(fresh, "kept_step") is not None  # forces a new step and a new trace
    kept_records, fresh_records = RecordCollector(), RecordCollector()
    _fit(kept, [_probe(kept_records)], data_seed=1)
    _fit(fresh, [_probe(fresh_records)], data_seed=1)
    assert kept_records.steps == fresh_records.steps == [4, 7]
    for got, expected in zip(kept_records.records, fresh_records.records):
        assert got.scalars.keys() == expected.scalars.keys()
        for tag, value in expected.scalars.items():
            np.testing.assert_allclose(got.scalars[tag], value, rtol=1e-6, atol=1e-7, err_msg=tag)
    assert weights_max_abs_difference(kept, fresh) == 0.0


def test_probed_fits_in_a_loop_train_like_plain_fits():
    probed, plain = _model(), _model()
    for seed in range(3):
        _fit(probed, [_probe(RecordCollector(), every_n_steps=1)], data_seed=seed)
        _fit(plain, [], data_seed=seed)
    assert weights_max_abs_difference(probed, plain) < 1e-6


def test_other_options_trace_again_and_read_their_own_buffers(traces):
    model = _model()
    _fit(model, [_probe(RecordCollector(), layers=["hidden"], histograms=False)])
    first = len(traces)
    everything = RecordCollector()
    _fit(model, [_probe(everything, layers="all", statistics="all")])
    second = len(traces)
    assert second > first
    assert "activation_hist/out" in everything.records[0].histograms
    # Back to the first options: reused, and only its own tags come back.
    hidden_only = RecordCollector()
    _fit(model, [_probe(hidden_only, layers=["hidden"], histograms=False)])
    assert len(traces) == second
    assert hidden_only.steps == [8, 11]
    assert hidden_only.records[0].histograms == {}
    assert not [tag for tag in hidden_only.records[0].scalars if tag.endswith("/out")]


def test_compiling_again_drops_the_kept_step(traces):
    model = _model()
    _fit(model, [_probe(RecordCollector())])
    first = len(traces)
    compile_classifier(model)
    records = RecordCollector()
    _fit(model, [_probe(records)])
    assert len(traces) > first
    assert records.steps == [0, 3]  # a new optimizer counts from 0


def test_a_guard_kept_from_a_tripped_fit_starts_the_next_one_clear():
    model = _model()
    x, y = classification_data(samples=32)
    bad = x.copy()
    bad[9, 0] = np.nan  # second batch
    first = kgrad.NonFiniteGuard()
    model.fit(bad, y, batch_size=8, shuffle=False, verbose=0, callbacks=[first])
    assert first.report is not None and first.report.step == 1
    second = kgrad.NonFiniteGuard()
    before = model.get_weights()
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[second])
    assert second.report is None
    assert model.optimizer.iterations.numpy() == 1 + 4
    assert max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(), before)) > 0


@pytest.mark.parametrize(
    "callbacks",
    [
        lambda: [kgrad.GradientProbe(every_n_steps=1, on_probe=RecordCollector())],
        lambda: [kgrad.NonFiniteGuard()],
        lambda: [kgrad.GradientProbe(every_n_steps=2, on_probe=RecordCollector()), kgrad.NonFiniteGuard()],
    ],
    ids=["probe", "guard", "probe_and_guard"],
)
def test_first_fit_traces_the_probing_step_once(traces, callbacks):
    # Keras builds the optimizer inside the first trace; a tf.function that
    # creates variables traces twice and keeps both graphs.
    model = _model()
    assert not model.optimizer.built
    callbacks = callbacks()
    _fit(model, callbacks)
    # A probe with a guard has two functions (the guard alone runs the
    # unprobed steps): each is traced once.
    assert len(traces) == len(callbacks)
    assert len(set(traces)) == len(traces)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_a_sequential_model_traces_the_probing_step_once(traces, jit_compile):
    keras.utils.set_random_seed(3)
    model = compile_classifier(sequential_classifier(), jit_compile=jit_compile)
    _fit(model, [kgrad.GradientProbe(every_n_steps=1, on_probe=RecordCollector())])
    assert len(traces) == 1


def test_probing_model_traces_its_step_once(traces):
    keras.utils.set_random_seed(3)
    model = compile_classifier(functional_classifier(kgrad.ProbingModel))
    _fit(model, [])
    assert len(traces) == 1
    assert model.probe_results is not None


def test_optimizer_built_before_tracing_trains_like_keras_building_it():
    # Same variables, same initial values, same order: same training.
    probed, plain = _model(), _model()
    _fit(probed, [kgrad.NonFiniteGuard()], epochs=2)
    _fit(plain, [], epochs=2)
    names = [_unprefixed(v) for v in probed.optimizer.variables]
    assert names == [_unprefixed(v) for v in plain.optimizer.variables]
    for got, expected in zip(probed.optimizer.variables, plain.optimizer.variables):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6, atol=1e-7, err_msg=got.path)
    assert weights_max_abs_difference(probed, plain) < 1e-6


def test_a_model_built_by_its_first_step_still_trains_and_probes():
    # Its weights, hence its optimizer's variables, are made in the trace.
    keras.utils.set_random_seed(3)
    model = compile_classifier(SubclassedClassifier())
    assert not model.built
    records = RecordCollector()
    _fit(model, [kgrad.GradientProbe(every_n_steps=1, on_probe=records)])
    assert records.steps == [0, 1, 2, 3]
    assert model.optimizer.built


def test_a_model_keras_cannot_build_symbolically_still_trains_and_probes(monkeypatch, traces):
    # Its variables are then built in the first trace, as without kgrad.
    def fails(self, **kwargs):
        raise RuntimeError("no symbolic build for this model")

    monkeypatch.setattr(keras.Model, "_symbolic_build", fails)
    probed, plain = _model(), _model()
    records = RecordCollector()
    _fit(probed, [kgrad.GradientProbe(every_n_steps=1, on_probe=records)])
    _fit(plain, [])
    assert records.steps == [0, 1, 2, 3]
    assert len(traces) == 2
    assert weights_max_abs_difference(probed, plain) < 1e-6


def _unprefixed(variable):
    return variable.path.partition("/")[2]  # without the optimizer's own name
