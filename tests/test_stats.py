"""`kgrad.backends.tensorflow.summarize.stats`: on-device summaries, checked against NumPy in float64."""

import numpy as np
import pytest
import tensorflow as tf

from kgrad.backends.tensorflow.summarize import stats

NAN, INF = float("nan"), float("inf")
MODES = ["eager", "xla"]


def _compiled(fn, mode):
    return fn if mode == "eager" else tf.function(fn, jit_compile=True)


def _with_nonfinite(shape=(6, 5), seed=0):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=shape).astype(np.float32)
    values[0, 0], values[1, 1], values[2, 2] = NAN, INF, -INF
    values[3, :2] = 0.0
    return values


def _numpy_moments(values):
    flat = np.asarray(values, dtype=np.float64).ravel()
    finite = flat[np.isfinite(flat)]
    return {
        # The norm of all elements: NaN or Inf when one is (as np.linalg.norm's).
        "norm": np.linalg.norm(flat) if flat.size else 0.0,
        "mean": finite.mean(),
        "std": finite.std(),
        "min": finite.min(),
        "max": finite.max(),
        "zero_fraction": np.count_nonzero(flat == 0.0) / flat.size,
        "nonfinite": flat.size - finite.size,
    }


# --- moments ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64])
def test_moments_match_numpy_over_finite_elements(dtype, mode):
    values = _with_nonfinite()
    tensor = tf.constant(values, dtype=dtype)
    got = _compiled(stats.moments, mode)(tensor).numpy()
    expected = _numpy_moments(tensor.numpy())
    assert got.dtype == np.float32 and got.shape == (len(stats.MOMENT_NAMES),)
    for index, name in enumerate(stats.MOMENT_NAMES):
        np.testing.assert_allclose(got[index], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_moments_of_only_non_finite_elements():
    got = stats.moments(tf.constant([NAN, INF, -INF])).numpy()
    assert np.isnan(got[0])
    np.testing.assert_array_equal(got[1:], [0.0, 0.0, 0.0, 0.0, 0.0, 3.0])
    got = stats.moments(tf.constant([1.0, INF, -INF])).numpy()
    assert got[0] == INF and got[6] == 2.0 and got[4] == 1.0


def test_moments_of_an_empty_tensor_are_zero_not_nan():
    np.testing.assert_array_equal(stats.moments(tf.zeros([0, 3])).numpy(), np.zeros(7))


def test_moments_of_exploding_values_stay_finite():
    # Squares of 1e20 overflow float32; an exploding gradient must still get
    # a finite norm, or it would read as NaN/Inf.
    values = np.array([3e20, -4e20, 1e19, 0.0], dtype=np.float32)
    got = stats.moments(tf.constant(values)).numpy()
    expected = _numpy_moments(values)
    for index, name in enumerate(stats.MOMENT_NAMES):
        np.testing.assert_allclose(got[index], expected[name], rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("offset", [0.0, 1e3, -5e4])
def test_moments_of_finite_values_match_numpy_also_when_the_mean_dominates(mode, offset):
    # All-finite tensors take the unmasked path; E[x²] - E[x]² would lose
    # the variance of values far from zero to round-off.
    values = (offset + np.random.default_rng(1).normal(size=(50, 40))).astype(np.float32)
    values[0, :7] = 0.0
    got = _compiled(stats.moments, mode)(tf.constant(values)).numpy()
    expected = _numpy_moments(values)
    for index, name in enumerate(stats.MOMENT_NAMES):
        np.testing.assert_allclose(got[index], expected[name], rtol=2e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_nonfinite", [False, True])
def test_summarize_equals_moments_and_histogram_apart(mode, with_nonfinite):
    values = _with_nonfinite(shape=(30, 20), seed=2)
    if not with_nonfinite:
        values = np.where(np.isfinite(values), values, 0.5).astype(np.float32)
    tensor = tf.constant(values)
    got_moments, got_histogram = _compiled(lambda x: stats.summarize(x, 9), mode)(tensor)
    moments = stats.moments(tensor)
    np.testing.assert_allclose(got_moments.numpy(), moments.numpy(), rtol=1e-6)
    finite = values[np.isfinite(values)].astype(np.float64)
    counts, edges = np.histogram(finite, bins=9, range=(finite.min(), finite.max()))
    np.testing.assert_allclose(got_histogram.numpy()[:, 0], edges[:-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got_histogram.numpy()[:, 2], counts)


def _numpy_histogram_counts(values, bucket_count):
    finite = np.asarray(values, dtype=np.float64).ravel()
    finite = finite[np.isfinite(finite)]
    low, high = (finite.min(), finite.max()) if finite.size else (0.0, 0.0)
    if high <= low:
        low, high = low - 0.5, high + 0.5
    return np.histogram(finite, bins=bucket_count, range=(low, high))


def _many_kinds_of_tensors(rng):
    normal = rng.normal(size=(20, 10)).astype(np.float32)
    relu = np.maximum(rng.normal(size=(7, 3, 5)), 0.0).astype(np.float32)
    return {
        "normal": normal,
        "relu (zeros)": relu,
        "dominating mean": (1e3 + rng.normal(size=(30, 4))).astype(np.float32),
        "constant": np.full((6,), 2.5, np.float32),
        "empty": np.zeros((0, 3), np.float32),
        "exploding": np.array([3e20, -4e20, 1e19, 0.0], np.float32),
        "non-finite": _with_nonfinite(seed=3),
    }


_BRANCH_CASES = {
    # Every tensor takes the straight-line path.
    "simple": ("normal", "relu (zeros)", "empty"),
    # Finite, but some need a centered pass for their variance.
    "dominating means": ("normal", "dominating mean", "constant", "empty"),
    # Some hold NaN/Inf or overflow float32 when squared: every tensor exact.
    "non-finite": (
        "normal", "relu (zeros)", "dominating mean", "constant", "empty", "exploding", "non-finite",
    ),
}


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
@pytest.mark.parametrize("case", sorted(_BRANCH_CASES))
def test_summarize_many_matches_numpy_for_each_tensor(mode, case):
    tensors = {
        name: values
        for name, values in _many_kinds_of_tensors(np.random.default_rng(4)).items()
        if name in _BRANCH_CASES[case]
    }
    run = {
        "eager": lambda f: f,
        "graph": tf.function,
        "xla": lambda f: tf.function(f, jit_compile=True),
    }[mode]
    # An odd bucket count: a constant's value is then mid-bucket, not on an edge.
    moments, histograms = run(lambda ts: stats.summarize_many(ts, 5))(
        [tf.constant(t) for t in tensors.values()]
    )
    assert moments.shape == (len(tensors), 7) and histograms.shape == (len(tensors), 5, 3)
    _check_against_numpy(moments, histograms, tensors)


def _check_against_numpy(moments, histograms, tensors):
    """Each row of ``summarize_many``'s results against NumPy; ``tensors`` by name."""
    bucket_count = histograms.shape[1]
    for row, (name, values) in enumerate(tensors.items()):
        if values.size:
            expected = _numpy_moments(values)
            for index, stat in enumerate(stats.MOMENT_NAMES):
                np.testing.assert_allclose(
                    moments[row, index], expected[stat], rtol=2e-5, atol=1e-6, err_msg=f"{name}: {stat}"
                )
        else:
            np.testing.assert_array_equal(moments[row], np.zeros(7), err_msg=name)
        counts, edges = _numpy_histogram_counts(values, bucket_count)
        np.testing.assert_array_equal(histograms[row, :, 2], counts, err_msg=name)
        np.testing.assert_allclose(histograms[row, :, 0], edges[:-1], rtol=1e-5, atol=1e-6, err_msg=name)


def test_under_xla_the_careful_branch_summarizes_tensors_of_several_blocks_exactly():
    # Under XLA the careful branch stacks every tensor in blocks of
    # `stats.BLOCK` elements: tensors of one element, of exactly two blocks,
    # of a block and a bit with NaN/Inf in its last block, and empty ones
    # (one at the end), traced with unknown shapes as a Keras step is.
    rng = np.random.default_rng(6)
    block = stats.BLOCK
    straddling = rng.normal(size=(block + 37,)).astype(np.float32)
    straddling[[3, block + 5, block + 36]] = [NAN, INF, -INF]
    tensors = {
        "one element": np.array([4.0], np.float32),
        "two blocks, dominating mean": (1e3 + rng.normal(size=(2, block))).astype(np.float32),
        "straddling, non-finite": straddling.reshape(-1, 1),
        "empty": np.zeros((0, 2), np.float32),
        "relu": np.maximum(rng.normal(size=(3, 5)), 0.0).astype(np.float32),
        "empty, last": np.zeros((4, 0), np.float32),
    }
    signature = [[tf.TensorSpec([None] * t.ndim, tf.float32) for t in tensors.values()]]
    summarize = tf.function(
        lambda ts: stats.summarize_many(ts, 7), jit_compile=True, input_signature=signature
    )
    moments, histograms = summarize([tf.constant(t) for t in tensors.values()])
    _check_against_numpy(moments, histograms, tensors)


def test_the_xla_careful_program_does_not_grow_with_the_number_of_tensors():
    # XLA compiles the careful branch whether it runs or not: a program per
    # tensor (~200 HLO lines each) took most of a probed step's compile time
    # and memory. In blocks, a tensor adds its padding and little else.
    def hlo_lines(count):
        tensors = [tf.ones([50 + i]) for i in range(count)]
        summarize = tf.function(lambda ts: stats.exact_summaries_in_blocks(ts, 5), jit_compile=True)
        return len(summarize.experimental_get_compiler_ir(tensors)(stage="hlo").splitlines())

    assert hlo_lines(30) - hlo_lines(3) < 10 * 27


@pytest.mark.parametrize("needing_care", ["dominating mean", "non-finite"])
def test_a_tensor_needing_care_leaves_the_summaries_of_the_others_as_they_were(needing_care):
    # One tensor that needs care sends the call down the careful branch; the
    # other tensors' summaries there are the straight-line branch's, bit for
    # bit. (Under XLA every tensor is summarized again there, on its own: the
    # XLA cases of the test above check those against NumPy.)
    kinds = _many_kinds_of_tensors(np.random.default_rng(5))
    simple = [tf.constant(kinds[name]) for name in ("normal", "relu (zeros)", "empty")]
    run = tf.function(lambda ts: stats.summarize_many(ts, 7))
    alone = run(simple)
    together = run(simple[:2] + [tf.constant(kinds[needing_care])] + simple[2:])
    for part in (0, 1):
        np.testing.assert_array_equal(tf.gather(together[part], [0, 1, 3]), alone[part])


def test_zero_fraction_counts_beyond_the_float32_integer_range():
    # More nonzeros than a float32 running sum of ones can count (2**24): it
    # would report 1000 zeros here instead of 10.
    size = 2**24 + 1000
    values = np.ones(size, np.float32)
    values[:: size // 10][:10] = 0.0
    moments, _ = stats.summarize_many([tf.constant(values)])
    # Exact up to float32 rounding of counts above 2**24 (a unit or two).
    np.testing.assert_allclose(moments[0, 5].numpy(), 10 / size, atol=2 / size)


def test_summarize_many_of_no_tensors():
    moments, histograms = stats.summarize_many([], 4)
    assert moments.shape == (0, 7) and histograms.shape == (0, 4, 3)
    assert stats.summarize_many([])[1] is None


def test_summarize_without_buckets_has_no_histogram():
    moments, histogram = stats.summarize(tf.constant([1.0, 2.0]))
    assert histogram is None and moments.shape == (7,)


# --- histogram -------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_histogram_matches_numpy_and_counts_add_up(mode):
    values = _with_nonfinite(shape=(40, 25))
    got = _compiled(lambda x: stats.histogram(x, 7), mode)(tf.constant(values)).numpy()
    finite = values[np.isfinite(values)].astype(np.float64)
    counts, edges = np.histogram(finite, bins=7, range=(finite.min(), finite.max()))
    assert got.shape == (7, 3)
    np.testing.assert_allclose(got[:, 0], edges[:-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:, 1], edges[1:], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[:, 2], counts)
    assert got[:, 2].sum() == finite.size == values.size - 3
    assert got[-1, 1] == np.float32(finite.max())  # the max is never cut off


def test_histogram_edges_are_contiguous():
    got = stats.histogram(tf.random.normal([100]), 5).numpy()
    np.testing.assert_array_equal(got[1:, 0], got[:-1, 1])


@pytest.mark.parametrize("mode", MODES)
def test_histogram_of_a_constant_tensor(mode):
    got = _compiled(lambda x: stats.histogram(x, 4), mode)(tf.fill([10], 2.0)).numpy()
    # A zero-width range is widened by 0.5 on each side.
    np.testing.assert_allclose(got[:, 0], [1.5, 1.75, 2.0, 2.25])
    np.testing.assert_allclose(got[:, 1], [1.75, 2.0, 2.25, 2.5])
    np.testing.assert_array_equal(got[:, 2], [0, 0, 10, 0])


def test_histogram_excludes_nan_and_inf():
    got = stats.histogram(tf.constant([NAN, 1.0, INF, 3.0, -INF]), 2).numpy()
    np.testing.assert_array_equal(got, [[1.0, 2.0, 1.0], [2.0, 3.0, 1.0]])


def test_histogram_of_only_non_finite_elements_is_empty():
    got = stats.histogram(tf.constant([NAN, INF]), 3).numpy()
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[:, 2], [0, 0, 0])


def test_histogram_value_range_counts_outliers_in_the_edge_buckets():
    got = stats.histogram(tf.constant([-5.0, 0.1, 0.6, 9.0]), 2, value_range=(0.0, 1.0)).numpy()
    np.testing.assert_allclose(got[:, :2], [[0.0, 0.5], [0.5, 1.0]])
    np.testing.assert_array_equal(got[:, 2], [2, 2])


def test_counts_beyond_float32_integer_precision():
    # A float32 running count stops at 2**24; activation gradients are larger.
    size = 2**24 + 64  # exactly representable in float32
    ones = tf.ones([size])
    assert stats.histogram(ones, 1).numpy()[0, 2] == size
    moments = dict(zip(stats.MOMENT_NAMES, stats.moments(tf.zeros([size])).numpy()))
    assert moments["zero_fraction"] == 1.0 and moments["nonfinite"] == 0.0


@pytest.mark.parametrize("bucket_count", [0, -1, 2.0, True, None])
def test_histogram_rejects_a_bad_bucket_count(bucket_count):
    with pytest.raises(
        ValueError, match=r"`bucket_count` must be a positive Python int\. Received: bucket_count="
    ):
        stats.histogram(tf.ones([3]), bucket_count)


# --- non-finite counts -----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_count_nonfinite_matches_numpy(mode):
    values = _with_nonfinite()
    values[4, 4] = NAN
    got = _compiled(stats.count_nonfinite, mode)(tf.constant(values)).numpy()
    np.testing.assert_array_equal(got, [np.isnan(values).sum(), np.isinf(values).sum()])


def test_count_nonfinite_of_integers_is_zero():
    np.testing.assert_array_equal(stats.count_nonfinite(tf.constant([1, 2, 3])).numpy(), [0, 0])
