"""`kgrad.backends.jax.summarize.one_pass`: one-read norms and the exact path built on them, against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kgrad.backends.jax.summarize.on_device import careful_summary_on_device
from kgrad.backends.jax.summarize.one_pass import (
    norm_from_sums, norm_parts, norms_in_one_read, reduce_in_one_pass,
)

NAN, INF = float("nan"), float("inf")
_rng = np.random.default_rng(0)

# Magnitudes in every range of Blue's algorithm: small (< 2**-63), middle, large (> 2**52), and mixed.
FINITE = {
    "normal": _rng.normal(size=(40, 7)),
    "huge": np.array([3e30, -4e30, 1e37]),  # squares overflow float32
    "tiny": np.array([3e-30, -4e-30, 1e-35]),  # squares underflow float32
    "small_and_middle": np.array([1e-25, 3.0, -4.0]),
    "tiny_only_beside_middle": np.array([1e-30, 1e-30, 2e-20]),
    "large_and_middle": np.array([1e20, 5.0, -1e19]),
    "every_range": np.array([1e-30, 1.0, 1e30]),
    # log-uniform over 1e-36..1e36, both signs: most elements in the middle range, some in each other
    "log_uniform": np.where(_rng.random(500) < 0.5, -1, 1) * 10.0 ** _rng.uniform(-36, 36, size=500),
    "zeros": np.zeros((3, 2)),
    "one": np.array([-7.0]),
    # One element: XLA folds its reduction away, and once rewrote (x·c)² as x²·c² (0 and NaN under jit).
    "one_huge": np.array([-1.5e19]),
    "one_tiny": np.array([[1e-25]]),
}


def norm_in_one_pass(x):
    return norm_from_sums(*reduce_in_one_pass(*norm_parts(x)))


def _numpy_norm(values):
    values = np.asarray(values, np.float32).astype(np.float64)
    return float(np.sqrt(np.sum(np.square(values))))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", sorted(FINITE))
def test_the_norm_in_one_pass_equals_a_float64_norm(case, jit):
    norm = jax.jit(norm_in_one_pass) if jit else norm_in_one_pass
    got = float(norm(jnp.asarray(FINITE[case], jnp.float32)))
    np.testing.assert_allclose(got, _numpy_norm(FINITE[case]), rtol=2e-6, atol=0)


@pytest.mark.parametrize("values, expected", [
    ([1.0, INF], INF), ([-INF, 2.0], INF), ([NAN, 1.0], NAN), ([NAN, INF], NAN), ([1e30, NAN], NAN),
    ([1e-30, NAN], NAN), ([], 0.0),
], ids=["inf", "minus_inf", "nan", "nan_and_inf", "nan_beside_large", "nan_beside_small", "empty"])
def test_a_non_finite_element_makes_the_norm_what_a_plain_norm_gives(values, expected):
    got = float(norm_in_one_pass(jnp.asarray(values, jnp.float32)))
    np.testing.assert_equal(got, expected)


def test_the_norm_is_of_every_axis_of_a_tensor_of_any_rank():
    values = _rng.normal(size=(3, 4, 5)) * 1e25
    np.testing.assert_allclose(float(norm_in_one_pass(jnp.asarray(values, jnp.float32))), _numpy_norm(values),
                               rtol=2e-6)


@pytest.mark.parametrize("case", ["normal", "huge", "tiny", "every_range", "log_uniform"])
def test_the_exact_path_on_the_devices_gets_the_norm_and_mean_of_the_finite_values(case):
    values = np.concatenate([FINITE[case].ravel(), [0.0]]).astype(np.float32)
    row, _ = careful_summary_on_device(jnp.asarray(values), None, set(range(7)))
    finite = values.astype(np.float64)
    np.testing.assert_allclose(float(row[0]), _numpy_norm(values), rtol=2e-6)
    np.testing.assert_allclose(float(row[1]), finite.mean(), rtol=1e-5, atol=1e-6 * np.abs(finite).max())
    with_inf = np.concatenate([values, [np.inf]]).astype(np.float32)
    row, _ = careful_summary_on_device(jnp.asarray(with_inf), None, set(range(7)))
    # A tensor holding Inf has an infinite norm; its mean is the finite values'.
    assert float(row[0]) == INF
    np.testing.assert_allclose(float(row[1]), finite.mean(), rtol=1e-5, atol=1e-6 * np.abs(finite).max())


def _norms_in_one_read(arrays, blue_only=False):
    """`norms_in_one_read` of two groups: ``arrays`` beside Σ of the first, and a plain normal tensor."""
    plain = jnp.asarray(_rng.normal(size=(5,)), jnp.float32)
    tensors = [jnp.asarray(array, jnp.float32) for array in arrays]
    groups = [lambda: (tensors, [(tensors[0], 0.0, jnp.add)]), lambda: ([plain], [])]
    (norms, (total,)), (plain_norm, _) = jax.jit(lambda: norms_in_one_read(groups, blue_only))()
    np.testing.assert_allclose(float(plain_norm[0]), _numpy_norm(plain), rtol=2e-6)
    np.testing.assert_allclose(float(total), np.sum(np.float64(np.float32(arrays[0]))), rtol=1e-5,
                               atol=1e-6 * np.abs(np.float32(arrays[0])).max())
    return [float(norm) for norm in norms]


@pytest.mark.parametrize("blue_only", [False, True], ids=["plain_or_blue", "blue_only"])
@pytest.mark.parametrize("case", sorted(FINITE))
def test_norms_in_one_read_equal_float64_norms_whichever_path_they_take(case, blue_only):
    # Beside the case, a tensor of the same shape that a plain sum of squares gets right: the whole
    # read falls back to Blue's norms when the case needs them (huge, tiny), and stays plain otherwise.
    beside = _rng.normal(size=np.shape(FINITE[case]))
    got = _norms_in_one_read([FINITE[case], beside], blue_only)
    np.testing.assert_allclose(got, [_numpy_norm(FINITE[case]), _numpy_norm(beside)], rtol=2e-6, atol=0)


@pytest.mark.parametrize("values, expected", [([1.0, INF], INF), ([NAN, 1.0], NAN), ([1e30, NAN], NAN)],
                         ids=["inf", "nan", "nan_beside_large"])
def test_norms_in_one_read_of_a_non_finite_tensor_are_what_a_plain_norm_gives(values, expected):
    np.testing.assert_equal(_norms_in_one_read([[1.0, 2.0], values])[1], expected)


SHARDED_SCRIPT = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from kgrad.backends.jax.summarize.one_pass import norm_from_sums, norm_parts, reduce_in_one_pass
norm = jax.jit(lambda x: norm_from_sums(*reduce_in_one_pass(*norm_parts(x))))
mesh = jax.make_mesh((4,), ("model",))
for value in (1e20, 1e-25, 3.0):
    x = jax.device_put(np.full(4, value, np.float32), NamedSharding(mesh, PartitionSpec("model")))
    print(repr(float(norm(x))))
"""


def test_the_norm_of_a_tensor_split_into_one_element_shards_is_exact():
    """A ``[4]`` bias over 4 devices: each device reduces one element (0 and 0 before, under jit)."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", SHARDED_SCRIPT], capture_output=True, text=True,
                            timeout=120, check=True)
    got = [float(line) for line in result.stdout.split()]
    np.testing.assert_allclose(got, [_numpy_norm(np.full(4, v)) for v in (1e20, 1e-25, 3.0)], rtol=2e-6)
