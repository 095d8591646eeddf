"""The ops a probed step's statistics add do not grow with the number of layers (issue 53).

Graph ops are counted, not timed: every tensor's reductions and log-magnitude
counts are one call of a function that is not inlined (rows of one matrix of
all the tensors, `kgrad.backends.tensorflow.summarize.blocks`), and nothing is
compiled by XLA outside an XLA step. The bucket of
every element is checked against the binary search of the bucket rule
(`kgrad.plan.histogram_buckets.signed_boundaries`, as NumPy's ``searchsorted``)
on every edge, its float32 neighbours and random bit patterns.
"""

import numpy as np
import pytest
import tensorflow as tf

from kgrad.backends.tensorflow.summarize import blocks, stats
from kgrad.backends.tensorflow.summarize.log_buckets import counts_of_keys, offset_keys
from kgrad.backends.tensorflow.summarize.summaries import SummaryBuilder
from kgrad.plan.histogram_buckets import (
    LOG_BUCKET_COUNT,
    MAGNITUDE_EDGES,
    SMALLEST_NORMAL,
    signed_boundaries,
)


def _layer_tensors(depth):
    # What a probed MLP captures per layer: an activation, its gradient, a kernel's
    # and a bias's gradient.
    shapes = [(8, 16), (8, 16), (16, 16), (16,)] * depth
    return [tf.TensorSpec(shape, tf.float32) for shape in shapes]


def _graph_ops(function, specs):
    """Ops of the traced graph, its inputs left out; a called function's ops are in its call."""
    graph = tf.function(function, autograph=False).get_concrete_function(specs).graph
    return [op.type for op in graph.get_operations() if op.type != "Placeholder"]


def _default_builder_outputs(tensors):
    builder = SummaryBuilder(histograms=True, bucket_count=LOG_BUCKET_COUNT, statistics="default")
    kinds = ["activation", "grad", "weight_grad", "weight_grad"]
    for index, tensor in enumerate(tensors):
        builder.add_tensor(kinds[index % 4], f"layer_{index // 4}/{index % 4}", tensor)
    return builder.scalars(), builder.histograms()


@pytest.mark.parametrize(
    "statistics",
    [
        lambda tensors: stats.summarize_many(tensors, LOG_BUCKET_COUNT),
        lambda tensors: stats.summarize_many(tensors)[0],
        _default_builder_outputs,
    ],
    ids=["log_histograms", "moments", "default_builder"],
)
def test_statistics_of_32_layers_add_the_ops_of_4(statistics):
    shallow = _graph_ops(statistics, _layer_tensors(4))
    deep = _graph_ops(statistics, _layer_tensors(32))
    # Not one op per tensor: the same graph whatever the depth (the tensors
    # enter one call; the branch for tensors that need care is a function
    # that runs only when one does).
    assert len(deep) == len(shallow), sorted(set(deep) ^ set(shallow))
    assert "Bucketize" not in deep and "L2Loss" not in deep


def test_statistics_compile_nothing_outside_an_xla_step():
    # An XLA program of the statistics grew with the number of tensors and
    # raised a small model's peak memory by 0.2-0.3 GB (benchmarks/RESULTS.md).
    graph = tf.function(_default_builder_outputs, autograph=False).get_concrete_function(_layer_tensors(4)).graph
    library = graph.as_graph_def().library.function
    assert library, "the statistics are a called function"
    compiled = [f.signature.name for f in library if f.attr["_XlaMustCompile"].b]
    assert not compiled, compiled


def _reference_rows(values):
    finite = values[np.isfinite(values)]
    bucket = np.searchsorted(signed_boundaries(), finite, side="right")
    counts = np.bincount(bucket, minlength=int(LOG_BUCKET_COUNT))
    in_float64 = values.astype(np.float64)
    big = np.finfo(np.float32).max
    extremes = [values.min(), values.max()] if values.size else [big, -big]
    row = [values.size, np.sum(in_float64**2), in_float64.sum(), *extremes, np.count_nonzero(values)]
    return np.array(row), counts


@pytest.mark.parametrize("known_shapes", [True, False], ids=["static", "dynamic"])
def test_rows_of_the_padded_matrix_are_each_tensors_own(known_shapes):
    # Sizes around the row length (the padding's zeros must not count as the
    # tensor's), an empty tensor, negative values only (a padded zero would be
    # the max), and zeros.
    rng = np.random.default_rng(2)
    tensors = [
        -1.0 - rng.random(blocks.BLOCK + 1),
        rng.standard_normal(blocks.BLOCK) * 1e-3,
        np.zeros(0),
        np.where(rng.random(3000) < 0.3, 0.0, rng.standard_normal(3000) * 1e3),
        -np.ones(1),
        5.0 + rng.random((7, 3)),
    ]
    tensors = [t.astype(np.float32) for t in tensors]
    specs = [tf.TensorSpec(t.shape if known_shapes else [None] * t.ndim, tf.float32) for t in tensors]
    rows, counts = tf.function(
        lambda *ts: blocks.reductions(list(ts), with_counts=True), input_signature=specs, autograph=False
    )(*tensors)
    moments_only, _ = tf.function(
        lambda *ts: blocks.reductions(list(ts), with_counts=False), input_signature=specs, autograph=False
    )(*tensors)
    for index, values in enumerate(tensors):
        expected_row, expected_counts = _reference_rows(values.reshape(-1))
        np.testing.assert_array_equal(counts[index].numpy(), expected_counts)
        for written in (rows[index].numpy(), moments_only[index].numpy()):
            np.testing.assert_array_equal(written[[0, 3, 4, 5]], expected_row[[0, 3, 4, 5]])
            np.testing.assert_allclose(written[1:3], expected_row[1:3], rtol=1e-6, atol=1e-6)


def _hard_values():
    values = [0.0, -0.0, np.inf, -np.inf, np.nan, SMALLEST_NORMAL, -SMALLEST_NORMAL, 1e-45, -1e-45, 3.4e38]
    for edge in MAGNITUDE_EDGES:
        for value in (np.float32(edge), -np.float32(edge)):
            values += [value, np.nextafter(value, np.float32(np.inf)), np.nextafter(value, np.float32(-np.inf))]
    rng = np.random.default_rng(0)
    random_bits = rng.integers(-(2**31), 2**31 - 1, 20000).astype(np.int32).view(np.float32)
    spread = rng.standard_normal(20000) * 10.0 ** rng.uniform(-15, 6, 20000)
    return np.concatenate([np.array(values, np.float32), random_bits, spread.astype(np.float32)])


def test_each_element_is_counted_in_the_bucket_of_the_rule_in_a_traced_step():
    values = _hard_values()
    finite = np.isfinite(values)
    expected = np.bincount(
        np.searchsorted(signed_boundaries(), values[finite], side="right"), minlength=int(LOG_BUCKET_COUNT)
    )
    half = values[: len(values) // 2].reshape(-1, 2)

    @tf.function(autograph=False)
    def histograms(first, second):
        return stats.summarize_many([first, second], LOG_BUCKET_COUNT)[1]

    written = histograms(tf.constant(values), tf.constant(half)).numpy()
    np.testing.assert_array_equal(written[0, :, 2], expected)
    half_finite = half[np.isfinite(half)]
    np.testing.assert_array_equal(
        written[1, :, 2],
        np.bincount(np.searchsorted(signed_boundaries(), half_finite, side="right"), minlength=int(LOG_BUCKET_COUNT)),
    )
    # Eagerly (no XLA), the same counts.
    eager = counts_of_keys(offset_keys([tf.constant(values)]), 1).numpy()[0]
    np.testing.assert_array_equal(eager, expected)


def test_moments_match_float64_on_a_long_tensor():
    # A float32 sum taken one element after another loses digits on a long
    # tensor; the reductions sum by rows, then the rows in float64.
    rng = np.random.default_rng(1)
    values = (1.0 + rng.random(1_000_003)).astype(np.float32)
    moments = tf.function(lambda x: stats.summarize_many([x])[0], autograph=False)(tf.constant(values))
    norm, mean, std, minimum, maximum, zero_fraction, nonfinite = moments.numpy()[0]
    in_float64 = values.astype(np.float64)
    np.testing.assert_allclose(
        [norm, mean, std, minimum, maximum],
        [np.linalg.norm(in_float64), in_float64.mean(), in_float64.std(), in_float64.min(), in_float64.max()],
        rtol=1e-5,
    )
    assert zero_fraction == 0.0 and nonfinite == 0.0
