"""`summarize.norms`: L2 norms, checked against NumPy in float64, also beyond float32's squares."""

import numpy as np
import pytest
import tensorflow as tf

from kgrad.backends.tensorflow.summarize import norms, stats

NAN, INF = float("nan"), float("inf")
MODES = ["eager", "xla"]


def _compiled(fn, mode):
    return fn if mode == "eager" else tf.function(fn, jit_compile=True)


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_norms_many_match_numpy_and_summarize_many(mode):
    rng = np.random.default_rng(5)
    arrays = [
        rng.normal(size=(4, 3)),
        rng.normal(size=(7,)) * 1e25,  # squares beyond float32: the rescaled branch
        np.zeros((0,)),
        rng.normal(size=(2, 2, 2)).astype(np.float16),
    ]
    tensors = [tf.constant(a, tf.float16 if a.dtype == np.float16 else tf.float32) for a in arrays]
    run = {"eager": norms.norms_many, "graph": tf.function(norms.norms_many)}.get(mode)
    got = (run or _compiled(norms.norms_many, mode))(tensors).numpy()
    expected = [np.linalg.norm(np.float64(t.numpy()).ravel()) for t in tensors]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    summarized = stats.summarize_many(tensors)[0][:, 0].numpy()
    np.testing.assert_allclose(got, summarized, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "bad, expected",
    [([NAN], "nan"), ([INF], "inf"), ([-INF], "inf"), ([INF, NAN], "nan"), ([3e30, NAN], "nan")],
)
def test_norms_many_are_nan_or_inf_when_an_element_is(mode, bad, expected):
    # The other tensors keep their exact norms, whichever branch ran.
    tensors = [tf.constant([3.0, 4.0]), tf.constant([1.0, *bad]), tf.constant([3e30, 4e30])]
    got = _compiled(norms.norms_many, mode)(tensors).numpy()
    assert got[1] == INF if expected == "inf" else np.isnan(got[1])
    np.testing.assert_allclose([got[0], got[2]], [5.0, 5e30], rtol=1e-6)


def test_norms_many_of_nothing_is_empty():
    assert norms.norms_many([]).shape == (0,)


@pytest.mark.parametrize("mode", MODES)
def test_example_norms_match_numpy(mode):
    values = np.random.default_rng(2).normal(size=(4, 3, 2)).astype(np.float32)
    values[1] *= 1e20  # would overflow if squared directly
    got = _compiled(norms.example_norms, mode)(tf.constant(values)).numpy()
    expected = np.linalg.norm(values.astype(np.float64).reshape(4, -1), axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_example_norms_keep_non_finite_rows_non_finite():
    got = norms.example_norms(tf.constant([[1.0, INF], [NAN, 0.0], [3.0, 4.0]])).numpy()
    assert got[0] == INF and np.isnan(got[1]) and got[2] == 5.0


@pytest.mark.parametrize("mode", MODES)
def test_global_norm_matches_numpy(mode):
    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=(3, 2)), rng.normal(size=(5,)) * 1e20, rng.normal(size=(2, 2, 2))]
    tensors = [tf.constant(a, tf.float32) for a in arrays]
    got = _compiled(norms.global_norm, mode)(tensors).numpy()
    expected = np.sqrt(sum(np.sum(np.float64(np.float32(a)) ** 2) for a in arrays))
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "bad, expected",
    [([NAN], "nan"), ([INF], "inf"), ([-INF, NAN], "nan"), ([INF, 3e30], "inf"), ([], "finite")],
)
def test_combined_norm_equals_global_norm_also_when_not_finite(mode, bad, expected):
    rng = np.random.default_rng(4)
    arrays = [rng.normal(size=(3, 2)).astype("float32"), (rng.normal(size=(5,)) * 1e20).astype("float32")]
    arrays.append(np.array([1.0, *bad], "float32"))
    tensors = [tf.constant(a) for a in arrays]

    def combined(tensors):
        moments = [stats.moments(t) for t in tensors]
        return norms.combined_norm([m[0] for m in moments])

    got = float(_compiled(combined, mode)(tensors))
    reference = float(norms.global_norm(tensors))
    if expected == "nan":
        assert np.isnan(got) and np.isnan(reference)
    elif expected == "inf":
        assert got == INF and reference == INF
    else:
        np.testing.assert_allclose(got, reference, rtol=1e-6)


def test_global_norm_of_nothing_is_zero_and_of_mixed_dtypes_is_float32():
    assert float(norms.global_norm([])) == 0.0
    got = norms.global_norm([tf.constant([3.0], tf.float16), tf.constant([4.0], tf.float64)])
    assert got.dtype == tf.float32 and float(got) == 5.0


def test_nan_max_keeps_a_nan_that_xla_fast_min_max_drops():
    # TensorFlow compiles reduce_max for XLA with fast min/max: a NaN can vanish from a max.
    values = tf.constant([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]])
    for jit_compile in (False, True):
        largest = tf.function(norms.nan_max, jit_compile=jit_compile)
        assert np.isnan(largest(values).numpy()), jit_compile
        np.testing.assert_array_equal(
            np.isnan(largest(values, axis=1).numpy()), [True, False], err_msg=str(jit_compile)
        )
        assert float(largest(values, axis=1)[1]) == 6.0
