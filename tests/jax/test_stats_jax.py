"""`kgrad.backends.jax.summarize.stats`: the meaning TensorFlow's statistics have, against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kgrad.backends.jax.summarize import stats

NAN, INF = float("nan"), float("inf")


def _numpy_row(values):
    values = np.asarray(values, np.float64).ravel()
    finite = values[np.isfinite(values)]
    norm = (
        np.nan if np.isnan(values).any() else (np.inf if np.isinf(values).any() else np.linalg.norm(values))
    )
    return [
        norm,
        finite.mean() if finite.size else 0.0,
        finite.std() if finite.size else 0.0,
        finite.min() if finite.size else 0.0,
        finite.max() if finite.size else 0.0,
        np.mean(values == 0) if values.size else 0.0,
        np.sum(~np.isfinite(values)),
    ]


CASES = {
    "normal": np.random.default_rng(0).normal(size=(40, 7)),
    "with_zeros": np.array([0.0, 0.0, 1.5, -2.0]),
    "with_nan_and_inf": np.array([1.0, NAN, 3.0, INF, -2.0]),
    "only_non_finite": np.array([NAN, INF, -INF]),
    "inf_no_nan": np.array([1.0, INF, -INF]),
    "exploding": np.array([3e20, -4e20, 1e19, 0.0]),
    "dominant_mean": 1e3 + np.random.default_rng(1).normal(size=200) * 1e-2,
}


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_moment_matches_numpy(case, jit):
    values = np.asarray(CASES[case], np.float32)
    summarize = jax.jit(lambda x: stats.summarize(x, 5)) if jit else (lambda x: stats.summarize(x, 5))
    row, histogram = summarize(jnp.asarray(values))
    expected = _numpy_row(values)
    np.testing.assert_allclose(np.asarray(row), expected, rtol=2e-5, atol=1e-6)
    finite = values[np.isfinite(values)]
    assert float(np.sum(histogram[:, 2])) == finite.size
    if finite.size and finite.min() < finite.max():
        assert float(histogram[0, 0]) == finite.min() and float(histogram[-1, 1]) == finite.max()
        counts, _ = np.histogram(finite, bins=5, range=(finite.min(), finite.max()))
        # Values on a bucket's edge may fall on either side in float32 (1e3 +- 1e-2: the
        # edges are a few float32 steps apart); none is lost.
        assert np.abs(np.asarray(histogram[:, 2]) - counts).max() <= 1


def test_only_the_asked_columns_of_finite_values_are_computed():
    values = jnp.asarray(CASES["normal"], jnp.float32)
    full, _ = stats.summarize(values, None)
    norm_only, _ = stats.summarize(values, None, columns=(0,))
    assert float(norm_only[0]) == pytest.approx(float(full[0]))
    assert np.isnan(np.asarray(norm_only[1:6])).all() and float(norm_only[6]) == 0.0
    # With NaN, Inf or squares beyond float32 the exact path computes the asked columns, exactly.
    for case in ("with_nan_and_inf", "inf_no_nan", "exploding", "only_non_finite"):
        expected = np.asarray(_numpy_row(CASES[case]))
        for columns in [(0,), (0, 6), (5,), (3, 4), (1, 2), (6,)]:
            row, _ = stats.summarize(jnp.asarray(CASES[case], jnp.float32), None, columns=columns)
            np.testing.assert_allclose(np.asarray(row)[list(columns)], expected[list(columns)], rtol=2e-5,
                                       err_msg=f"{case} {columns}")
            others = [column for column in range(7) if column not in columns and column not in (3, 4, 6)]
            assert np.isnan(np.asarray(row)[others]).all(), (case, columns)


def test_an_empty_tensor_has_zero_moments_and_an_empty_histogram():
    row, histogram = stats.summarize(jnp.zeros((0, 3)), 3)
    np.testing.assert_array_equal(np.asarray(row), np.zeros(7))
    np.testing.assert_array_equal(np.asarray(histogram[:, 2]), [0, 0, 0])


def test_a_constant_tensor_gets_one_bucket_of_width_one():
    _, histogram = stats.summarize(jnp.full((6,), 2.0), 2)
    np.testing.assert_allclose(np.asarray(histogram), [[1.5, 2.0, 0.0], [2.0, 2.5, 6.0]])


@pytest.mark.parametrize("with_non_finite", [False, True])
def test_a_group_behind_one_branch_gives_what_each_tensor_gives_alone(with_non_finite):
    names = [name for name in sorted(CASES) if with_non_finite or np.isfinite(CASES[name]).all()]
    items = [(jnp.asarray(CASES[name], jnp.float32), 5 if index % 2 else None, (0, 3, 4, 6))
             for index, name in enumerate(names)]
    items.append((jnp.zeros((0, 2)), 3, (0,)))  # an empty tensor keeps its own answer
    grouped = jax.jit(lambda tensors: stats.summarize_group(
        [(tensor, buckets, columns) for tensor, (_, buckets, columns) in zip(tensors, items)]))(
        [tensor for tensor, _, _ in items])
    for (tensor, buckets, columns), (row, histogram) in zip(items, grouped):
        alone_row, alone_histogram = stats.summarize(tensor, buckets, columns)
        np.testing.assert_allclose(np.asarray(row)[list(columns)], np.asarray(alone_row)[list(columns)],
                                   rtol=1e-6)
        if buckets is None:
            assert histogram is None
        else:
            np.testing.assert_allclose(np.asarray(histogram), np.asarray(alone_histogram), rtol=1e-6)
    if with_non_finite:  # one tensor's NaN sends the whole group down the exact path: still exact
        row = np.asarray(grouped[names.index("normal")][0])
        np.testing.assert_allclose(row[[0, 3, 4, 6]], np.asarray(_numpy_row(CASES["normal"]))[[0, 3, 4, 6]],
                                   rtol=2e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_the_exact_path_buckets_finite_values_as_the_fast_path_does(jit):
    # A NaN sends the tensor down the exact path (NumPy, on the host): its histogram of the
    # finite values is, bucket for bucket, the fast path's of the same values without it.
    finite = np.random.default_rng(2).normal(size=300).astype(np.float32)
    summarize = jax.jit(stats.summarize, static_argnums=1) if jit else stats.summarize
    _, fast = summarize(jnp.asarray(finite), 7)
    _, exact = summarize(jnp.asarray(np.append(finite, [np.nan, np.inf])), 7)
    np.testing.assert_array_equal(np.asarray(exact)[:, 2], np.asarray(fast)[:, 2])
    # The edges within a float32 rounding: XLA may fuse low + width * i into one multiply-add.
    np.testing.assert_allclose(np.asarray(exact)[:, :2], np.asarray(fast)[:, :2], rtol=1e-6)


def test_the_exact_path_runs_inside_a_differentiated_function_and_under_vmap():
    # An activation's statistics are taken in the differentiated forward pass (as aux):
    # the host call must see no gradient there.
    def loss_and_row(w):
        hidden = jnp.log(w)  # log(-1): NaN
        return jnp.sum(jnp.exp(w)), stats.summarize(hidden, 3, (0, 6))[0]

    (_, row), gradient = jax.jit(jax.value_and_grad(loss_and_row, has_aux=True))(jnp.array([1.0, -1.0, 2.0]))
    np.testing.assert_allclose(np.asarray(gradient), np.exp([1.0, -1.0, 2.0]), rtol=1e-6)
    assert np.isnan(float(row[0])) and float(row[6]) == 1.0
    # Under jax.vmap the host call runs once per example.
    batch = jnp.asarray([[1.0, np.inf], [3.0, 4.0]], jnp.float32)
    rows, _ = jax.vmap(lambda x: stats.summarize(x, 2))(batch)
    np.testing.assert_allclose(np.asarray(rows), [_numpy_row(row) for row in np.asarray(batch)], rtol=1e-6)
