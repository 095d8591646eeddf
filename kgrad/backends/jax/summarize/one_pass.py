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

from kgrad.backends.common.norms import squares_are_exact

# Anderson (2017), "Algorithm 978: Safe scaling in the Level 1 BLAS", for float32: magnitudes below
# _SMALL are scaled up by _SCALE_SMALL, above _BIG down by _SCALE_BIG, before squaring. Powers of two:
# the scaling itself rounds nothing.
_SMALL, _BIG = 2.0**-63, 2.0**52
_SCALE_SMALL, _SCALE_BIG = 2.0**75, 2.0**-76
# A tensor of up to this many elements is reduced in one stage (its error: ~n float32 ulps).
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
    operands = tuple(_in_blocks(x, start) for x, start in zip(operands, starts))
    blocks = jax.lax.reduce(operands, starts, combined, (1,))
    return jax.lax.reduce(blocks, starts, combined, (0,))


def _in_blocks(x, start):
    """``x`` flattened into rows of about √n elements, the last padded with ``start``: ``[rows, block]``.

    A sum over the rows, then over their totals, adds at most ~√n terms in each
    stage. A reshape that moves nothing: for one device (a sharded tensor
    would be gathered).
    """
    flat = jnp.ravel(x)
    block = 1 << math.ceil(math.log2(math.sqrt(max(flat.size, 1))))
    return jnp.pad(flat, (0, -flat.size % block), constant_values=start).reshape(-1, block)


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
        # Selected, then squared: where XLA folds a one-element reduction away (a one-element
        # tensor or shard), its simplifier rewrote the square of a product with a constant,
        # (x·c)², as x²·c², whose c² (2**150, 2**-152) is Inf or 0 in float32 (a `[1e20]`
        # had the norm 0, a `[1e-25]` NaN). A select between them is no such product.
        (jnp.square(jnp.where(small, x * _SCALE_SMALL, 0.0)), 0.0, jnp.add),
        # NaN compares false with both bounds: it is summed here, and the norm is NaN.
        (jnp.where(small | large, 0.0, jnp.square(x)), 0.0, jnp.add),
        (jnp.square(jnp.where(large, x * _SCALE_BIG, 0.0)), 0.0, jnp.add),
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


def norms_in_one_read(groups, blue_only=False):
    """``[(norms, other totals)]`` of ``groups`` of same-shape tensors, each group read once.

    ``groups``: functions, each giving ``(tensors, other parts)``, the parts
    as `reduce_in_one_pass`'s, reduced with the tensors' squares. A plain
    float32 sum of squares is exact to float32 rounding when it is finite
    and at least n·2**-100 (the squares that underflow then weigh less than
    2**-26 of it), or when the tensor is all zeros; that is one cheap read.
    Where any group's is not, every norm is Blue's (`norm_parts`), in a
    second read behind one ``lax.cond`` that a usual step never takes. Blue's
    read costs about five times a plain one on XLA's CPU backend (its
    selects; benchmarks/RESULTS.md). The second read calls each function
    again inside the branch, so that its tensors are computed there from
    what it reads (a weight and its update), not written out whole for it.
    ``blue_only``: Blue's norms in the one read (for a branch of its own,
    such as a skipped step's: a second branch in it made XLA write out the
    would-be weights, which nothing else holds). Under a distribution too:
    there the second branch held 13 KB more per device in the probed step
    of `tests/jax/test_model_parallel_hlo_jax.py`, and more collectives.

    Example:

    >>> import jax.numpy as jnp
    >>> x, tiny = jnp.array([3.0, 4.0]), jnp.array([3e-30, 4e-30])
    >>> group = lambda: ([x, tiny], [(jnp.array([1.0, 2.0]), 0.0, jnp.add)])  # norms, and Σ of 1, 2
    >>> [(norms, (dot,))] = norms_in_one_read([group])
    >>> [f"{float(n):.4g}" for n in norms], float(dot)  # (3e-30)² underflows: Blue's
    (['5', '5e-30'], 3.0)
    """
    if blue_only or on_several_devices():
        results = []
        for group in groups:
            tensors, others = group()
            totals = reduce_in_one_pass(*[part for t in tensors for part in norm_parts(t)], *others)
            count = 3 * len(tensors)
            results.append((jnp.stack([norm_from_sums(*totals[k:k + 3]) for k in range(0, count, 3)]),
                            totals[count:]))
        return results
    reads, exact = [], []
    for group in groups:
        tensors, others = group()
        tensors = [jnp.asarray(t, jnp.float32) for t in tensors]
        totals = reduce_in_one_pass(*[(jnp.square(t), 0.0, jnp.add) for t in tensors],
                                    *[(jnp.abs(t), 0.0, jnp.maximum) for t in tensors], *others)
        reads.append((len(tensors), totals))
        squares, largest = totals[:len(tensors)], totals[len(tensors):2 * len(tensors)]
        exact += [squares_are_exact(s, tensors[0].size, m) for s, m in zip(squares, largest)]

    def plain():
        return [jnp.sqrt(jnp.stack(totals[:count])) for count, totals in reads]

    def blue():
        return [norms for norms, _ in norms_in_one_read([lambda g=g: (g()[0], []) for g in groups], True)]

    norms = jax.lax.cond(jnp.all(jnp.stack(exact)), plain, blue) if reads else []
    return [(norm, totals[2 * count:]) for norm, (count, totals) in zip(norms, reads)]
