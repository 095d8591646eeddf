"""Reductions that read a tensor once and write nothing the size of it: several totals, and an L2 norm.

XLA's CPU backend hands a reduction of one operand to its YNNPACK fusions,
which do not compute a comparison, a select or a conversion as they read:
each mask or masked copy was written out whole first, the size of the
tensor. A value read by two reductions (``x / max|x|`` for the norm of
``x`` and for its sum) was written out too. One reduction of several
operands (`reduce_in_one_pass`) is fused with what makes its operands.

`norm_parts` and `norm_from_sums` make an L2 norm that neither overflows
nor underflows and needs no first pass for the largest magnitude: Blue's
algorithm, three sums of squares over fixed magnitude ranges (the small
ones scaled up, the large ones scaled down, by powers of two), combined at
the end. Their three sums join the other totals of the same read. Under
``keras.distribution.ModelParallel`` this took the probed step's
temporaries per device from 316 KB to 263 KB (`docs/sharded.md`, "What it
costs"): the norm of a weight and of its change no longer write the tensor
divided by its largest magnitude.

Example:

>>> import jax.numpy as jnp
>>> x = jnp.array([3e30, 0.0, -4e30])
>>> zeros, *sums = reduce_in_one_pass((x == 0, 0, jnp.add), *norm_parts(x))
>>> int(zeros), f"{float(norm_from_sums(*sums)):.4g}"  # (3e30)² overflows float32
(1, '5e+30')
"""

import math

import jax
import jax.numpy as jnp
import keras

# Anderson (2017), "Algorithm 978: Safe scaling in the Level 1 BLAS", for float32: magnitudes below
# _SMALL are scaled up by _SCALE_SMALL, above _BIG down by _SCALE_BIG, before squaring. Powers of two:
# the scaling itself rounds nothing.
_SMALL, _BIG = 2.0**-63, 2.0**52
_SCALE_SMALL, _SCALE_BIG = 2.0**75, 2.0**-76
# A tensor of one axis up to this many elements is summed in one stage (its error: ~n float32 ulps).
_ONE_STAGE = 4096


def reduce_in_one_pass(*parts):
    """``(operand, start, combine)`` parts (one shape) reduced over every axis in one pass.

    One reduction of several operands: as one reduction each, XLA's CPU
    backend wrote each mask or masked copy out whole first, and gave a
    branch never run on a clean step (the guard's NaN and Inf counts, the
    exact path) scratch arrays the size of its tensors: 12% of Keras' step's
    memory per device for the guard (tests/jax/test_model_parallel_hlo_jax.py).
    A boolean mask is counted in int32: a float32 count stops growing at
    2**24 elements.

    On one device the tensor is read once, in two stages: blocks of about
    √n elements first, then the blocks' totals. XLA's CPU backend adds up a
    reduction of several operands element after element, in float32, and in
    one stage a sum of 2**24 squares came out 1.5-3% low (a sum stops
    growing once its terms are below its rounding step;
    `tests/test_large_tensors.py`). The tensor is flattened and padded with
    the starts to whole blocks. The two stages cost what one did. Under a
    distribution the tensor keeps its shape and is reduced in one stage:
    each device sums what it holds, then an all-reduce of the totals (a
    second stage over the blocks' totals made XLA gather them instead).

    Example:

    >>> import jax.numpy as jnp
    >>> ones = jnp.ones(2**25)  # element after element, a float32 sum stops at 2**24
    >>> total, largest = reduce_in_one_pass((ones, 0.0, jnp.add), (ones, -jnp.inf, jnp.maximum))
    >>> int(total), float(largest)
    (33554432, 1.0)
    """
    # Statistics, not differentiated (a reduction of several operands has no derivative rule).
    operands = tuple(jax.lax.stop_gradient(x.astype(jnp.int32) if x.dtype == jnp.bool_ else x)
                     for x, _, _ in parts)
    starts = tuple(jnp.asarray(start, x.dtype) for (_, start, _), x in zip(parts, operands))

    def combined(left, right):
        return tuple(combine(a, b) for (_, _, combine), a, b in zip(parts, left, right))

    size = operands[0].size
    if size <= _ONE_STAGE or on_several_devices():
        return jax.lax.reduce(operands, starts, combined, tuple(range(operands[0].ndim)))
    block = 1 << math.ceil(math.log2(math.sqrt(size)))
    padding = -size % block
    operands = tuple(jnp.pad(jnp.ravel(x), (0, padding), constant_values=start).reshape(-1, block)
                     for x, start in zip(operands, starts))
    blocks = jax.lax.reduce(operands, starts, combined, (1,))
    return jax.lax.reduce(blocks, starts, combined, (0,))


def on_several_devices():
    """Whether the step being traced runs under a ``keras.distribution`` over more than one device."""
    distribution = keras.distribution.distribution()
    return distribution is not None and distribution.device_mesh.devices.size > 1


def norm_parts(x):
    """The three `reduce_in_one_pass` parts of ``x``'s norm: its small, middle and large squares summed.

    Give them to one reduction with other parts of the same tensor, then
    `norm_from_sums` of their three totals.
    """
    x = jnp.asarray(x, jnp.float32)
    magnitude = jnp.abs(x)
    small, large = magnitude < _SMALL, magnitude > _BIG
    return (
        (jnp.where(small, jnp.square(x * _SCALE_SMALL), 0.0), 0.0, jnp.add),
        # NaN compares false with both bounds: it is summed here, and the norm is NaN.
        (jnp.where(small | large, 0.0, jnp.square(x)), 0.0, jnp.add),
        (jnp.where(large, jnp.square(x * _SCALE_BIG), 0.0), 0.0, jnp.add),
    )


def norm_from_sums(small_sum, middle_sum, large_sum):
    """The L2 norm from the three totals of `norm_parts` (Blue's combination, as in Algorithm 978).

    Inf in the tensor gives Inf, NaN gives NaN, as a plain norm would.

    Example:

    >>> import jax.numpy as jnp
    >>> for x in ([3.0, 4.0], [3e-30, 4e-30], [1e30, jnp.inf]):  # (3e-30)² underflows float32
    ...     print(f"{float(norm_from_sums(*reduce_in_one_pass(*norm_parts(jnp.array(x))))):.4g}")
    5
    5e-30
    inf
    """
    middle_counts = (middle_sum > 0) | jnp.isnan(middle_sum)
    # Large values present: the small ones are below float32's resolution beside them.
    with_large = jnp.sqrt(large_sum + jnp.where(middle_counts, middle_sum * _SCALE_BIG * _SCALE_BIG, 0.0))
    with_large = with_large / _SCALE_BIG
    root_middle, root_small = jnp.sqrt(middle_sum), jnp.sqrt(small_sum) / _SCALE_SMALL
    low, high = jnp.minimum(root_middle, root_small), jnp.maximum(root_middle, root_small)
    small_and_middle = high * jnp.sqrt(1.0 + jnp.square(low / jnp.where(high > 0, high, 1.0)))
    with_small = jnp.where(middle_counts, jnp.where(jnp.isnan(middle_sum), middle_sum, small_and_middle),
                           root_small)
    return jnp.where(large_sum > 0, with_large, jnp.where(small_sum > 0, with_small, root_middle))

