"""L2 norms on device, exact at any magnitude, NaN or Inf when an element is: TensorFlow's kernels.

A norm read alone must not look finite when its tensor is not, so these are
the norms of *every* element (as ``tf.norm``'s), unlike the mean, std, min
and max of `kgrad.backends.tensorflow.summarize.stats`, which are of the finite elements. Squares of
exploding gradients (|g| > 1e19) overflow float32: where that can happen the
tensor is divided by its largest magnitude first.
"""

import tensorflow as tf

from kgrad.backends.tensorflow.summarize import one_pass

# Written once for every backend with keras.ops, at the cost of TensorFlow's
# kernels (measured in kgrad.backends.common.norms); re-exported for the pipeline.
from kgrad.backends.common.norms import squares_are_exact
from kgrad.backends.common.norms import (  # noqa: F401
    combined_norm,
    example_norms,
    global_norm,
    nan_max,
    safe_norm,
)


def sum_of_squares(x):
    """``sum(x²)`` in float32, in one pass over ``x`` with no temporary.

    ``tf.nn.l2_loss`` is one fused kernel; ``reduce_sum(square(x))`` is two
    passes and a tensor the size of ``x`` (``keras.ops``' only way: 2.2x the
    CPU time without XLA, ``benchmarks/keras_ops_norms.py``), so it stays here.

    Example:

    >>> import tensorflow as tf

    >>> from kgrad.backends.tensorflow.summarize import norms
    >>> float(norms.sum_of_squares(tf.constant([3.0, 4.0])))
    25.0
    """
    return 2.0 * tf.nn.l2_loss(tf.cast(x, tf.float32))


def l2_norm(x):
    """The L2 norm of all of ``x``, in float32, in one pass (see `sum_of_squares`).

    Example:

    >>> import tensorflow as tf

    >>> from kgrad.backends.tensorflow.summarize import norms
    >>> float(norms.l2_norm(tf.constant([[3.0], [4.0]])))
    5.0
    """
    return tf.sqrt(sum_of_squares(x))


def norms_many(tensors):
    """The L2 norm of each of ``tensors``, exact at any magnitude: a ``[n]`` float32 vector.

    What a probed step needs of a tensor when only its norm is written (a
    bias's gradient, which only enters the global norm; a kernel's gradient
    without its histogram): one sum of squares per tensor, all of them in one
    call (`kgrad.backends.tensorflow.summarize.one_pass`: one kernel for all),
    against the five reductions of `kgrad.backends.tensorflow.summarize.stats.summarize_many`. Only when a
    sum of squares is not finite (a NaN or Inf, or squares beyond float32)
    does one branch for the whole call rescale each tensor by its largest
    magnitude.

    Args:
        tensors: A list of tensors of any float dtype and shape.

    Returns:
        The norms: NaN for a tensor holding a NaN, else Inf for one holding
        an Inf (as `kgrad.backends.tensorflow.summarize.stats.summarize_many`'s norm column), 0 for an
        empty tensor.

    Example:

    >>> import tensorflow as tf

    >>> from kgrad.backends.tensorflow.summarize import norms
    >>> result = norms.norms_many([tf.constant([3.0, 4.0]), tf.constant([3e30, 4e30])])
    >>> [f"{value:.4g}" for value in result.numpy()]  # 3e30² is beyond float32
    ['5', '5e+30']
    """
    if not tensors:
        return tf.zeros([0])
    # All the sums of squares in one call: no op per tensor in the step.
    squares = one_pass.sums_of_squares(tensors)
    sizes = tf.constant([float(max(t.shape.num_elements() or 0, 0)) for t in tensors])
    # Finite, and not so small that squares flushed to 0 could weigh (`squares_are_exact`; with no
    # max here, an all-zero tensor takes the rescaled branch too).
    return tf.cond(
        tf.reduce_all(squares_are_exact(squares, sizes)),
        lambda: tf.sqrt(squares),
        lambda: tf.stack([safe_norm(tf.reshape(tf.cast(t, tf.float32), [-1])) for t in tensors]),
    )
