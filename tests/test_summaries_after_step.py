"""Under XLA, a GradientProbe's statistics run after the step, outside XLA.

The XLA step returns the tensors to summarize (`SummaryBuilder.inputs`) and
`ProbingStep.summarize_after_step` summarizes them with TensorFlow's kernels:
the compiled program stays close to the plain step's. These tests check that
the statistics really leave the XLA program, and that they are the same as
those of the step that computes them inside it (``steps_per_execution=2``
keeps them there).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from fit_helpers import classification_data, compile_classifier, functional_classifier
from kgrad.backends.tensorflow.summarize import stats
from kgrad.backends.tensorflow.summarize.summaries import SummaryBuilder


def _builder(tensors, bucket_count=4):
    builder = SummaryBuilder(histograms=True, bucket_count=bucket_count)
    indices = [builder.add_tensor("activation", f"t{i}", t) for i, t in enumerate(tensors[:2])]
    builder.add_scalars(["weight_norm/a", "weight_norm/b"], tf.stack([tf.norm(t) for t in tensors[:2]]))
    builder.add_scalar(
        "global/sum_of_maxima",
        lambda moments, summarized: tf.reduce_max(summarized[indices[0]]) + moments[indices[1], 4],
    )
    builder.add_tensor("grad", "t2", tensors[2])
    builder.add_scalar("global/first", tensors[2][0])
    return builder


def test_with_inputs_summarizes_the_new_tensors_as_a_builder_made_from_them():
    old = [tf.constant([1.0, -2.0]), tf.constant([[3.0], [0.0]]), tf.constant([0.5, 0.25, 4.0])]
    new = [tf.constant([7.0, 2.0]), tf.constant([[-1.0], [5.0]]), tf.constant([2.0, np.nan, 1.0])]
    builder = _builder(old)
    inputs = builder.inputs()
    # The added tensors, then the scalar tensors, in the order they came.
    assert [tuple(t.shape) for t in inputs] == [(2,), (2, 1), (3,), (2,), (1,)]
    direct = _builder(new)
    rebound = builder.with_inputs(direct.inputs())
    assert rebound.scalar_names == direct.scalar_names == builder.scalar_names
    assert rebound.histogram_names == direct.histogram_names
    np.testing.assert_array_equal(rebound.scalars().numpy(), direct.scalars().numpy())
    np.testing.assert_array_equal(rebound.histograms().numpy(), direct.histograms().numpy())
    scalars = dict(zip(rebound.scalar_names, rebound.scalars().numpy()))
    assert scalars["global/sum_of_maxima"] == 7.0 + 5.0
    assert scalars["global/first"] == 2.0
    assert scalars["grad_nonfinite/t2"] == 1.0
    # The original builder still summarizes its own tensors.
    assert dict(zip(builder.scalar_names, builder.scalars().numpy()))["global/first"] == 0.5


def test_with_inputs_names_what_it_expected():
    builder = _builder([tf.ones([2]), tf.ones([2]), tf.ones([3])])
    with pytest.raises(ValueError, match="expected the 5 tensors that inputs\\(\\) returns, received 2"):
        builder.with_inputs([tf.ones([2]), tf.ones([2])])


def _fit(steps_per_execution, monkeypatch, contexts):
    """``(model, probe, records)`` of a probed XLA fit; ``contexts``: `stats.in_xla()` at each summary."""
    summarize_many = stats.summarize_many

    def recording(tensors, bucket_count=None):
        contexts.append(stats.in_xla())
        return summarize_many(tensors, bucket_count)  # the same values: it only records where

    monkeypatch.setattr(stats, "summarize_many", recording)
    keras.utils.set_random_seed(3)
    x, y = classification_data(samples=22)  # a last batch of 2: a retrace
    model = compile_classifier(
        functional_classifier(), jit_compile=True, steps_per_execution=steps_per_execution
    )
    records = []
    probe = kgrad.GradientProbe(None, every_n_steps=1, bucket_count=6, on_probe=records.append)
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[probe])
    return model, probe, records


@pytest.fixture(scope="module")
def fits():
    """``{steps_per_execution: (model, probe, records, contexts)}``: both tests read the same two fits.

    One step per execution takes the statistics out of the XLA step; two keep them in it.
    """
    result = {}
    for steps_per_execution in (1, 2):
        contexts = []
        with pytest.MonkeyPatch.context() as monkeypatch:
            result[steps_per_execution] = (*_fit(steps_per_execution, monkeypatch, contexts), contexts)
    return result


def test_under_xla_the_statistics_are_traced_outside_the_compiled_step(fits):
    _, probe, records, contexts = fits[1]
    assert probe._step.plan.statistics_after_step
    assert contexts and not any(contexts)
    assert [record.step for record in records] == list(range(12))
    # The control: two steps per execution keep the statistics in the step.
    _, probe, _, contexts = fits[2]
    assert not probe._step.plan.statistics_after_step
    assert contexts and all(contexts)


def test_statistics_after_the_step_equal_those_computed_inside_it(fits):
    after_model, _, after, _ = fits[1]
    inside_model, _, inside, _ = fits[2]
    assert [r.step for r in after] == [r.step for r in inside] == list(range(12))
    for got, expected in zip(after, inside):
        assert got.scalars.keys() == expected.scalars.keys()
        for tag, value in expected.scalars.items():
            np.testing.assert_allclose(got.scalars[tag], value, rtol=1e-5, atol=1e-7, err_msg=tag)
        assert got.histograms.keys() == expected.histograms.keys()
        for tag, histogram in expected.histograms.items():
            np.testing.assert_allclose(got.histograms[tag], histogram, rtol=1e-5, atol=1e-7, err_msg=tag)
    for got, expected in zip(after_model.get_weights(), inside_model.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
