"""keras.ops against TensorFlow's kernels for the norms kgrad could write once for every backend.

Issue 40: a statistic is written once with ``keras.ops`` where that costs no
more than today's TensorFlow kernel, and stays a backend kernel where it does.
Each case runs both forms in ``tf.function`` (with and without XLA) on the
same tensor, checks that they agree, and reports the median of the per-pair
CPU-time ratios over interleaved pairs (shared/BENCHMARKING.md).

Run: ``python -m benchmarks.keras_ops_norms [--pairs 11]``.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _cases():
    import tensorflow as tf
    from keras import ops

    from kgrad.backends.common import norms as common

    def tensorflow_norm(x, axis=None):  # the kernel kgrad used before (tf.norm of rescaled values)
        scale = tf.reduce_max(tf.abs(x), axis=axis, keepdims=axis is not None)
        scale = tf.where(tf.logical_and(scale > 0, tf.math.is_finite(scale)), scale, tf.ones_like(scale))
        norm = tf.norm(x / scale, axis=axis, keepdims=axis is not None) * scale
        return norm if axis is None else tf.squeeze(norm, axis)

    def tensorflow_example_norms(x):
        return tensorflow_norm(tf.reshape(x, [tf.shape(x)[0], -1]), axis=1)

    def tensorflow_sum_of_squares(x):
        return 2.0 * tf.nn.l2_loss(x)

    def keras_sum_of_squares(x):
        return ops.sum(ops.square(x))

    return {
        "example_norms [256, 16384]": (tensorflow_example_norms, common.example_norms,
                                       tf.random.normal([256, 16384]), 20),
        "combined_norm [2000]": (tensorflow_norm, common.combined_norm, tf.random.uniform([2000]), 200),
        "sum of squares [4M]": (tensorflow_sum_of_squares, keras_sum_of_squares,
                                tf.random.normal([4_000_000]), 20),
    }


def _cpu_seconds(function, x, repeats):
    start = time.process_time()
    for _ in range(repeats):
        result = function(x)
    result.numpy()
    return (time.process_time() - start) / repeats


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=11)
    args = parser.parse_args(argv)
    import numpy as np
    import tensorflow as tf

    for name, (tensorflow_form, keras_form, x, repeats) in _cases().items():
        for xla in (False, True):
            ours = tf.function(tf.autograph.experimental.do_not_convert(keras_form), jit_compile=xla)
            theirs = tf.function(tf.autograph.experimental.do_not_convert(tensorflow_form), jit_compile=xla)
            np.testing.assert_allclose(ours(x).numpy(), theirs(x).numpy(), rtol=1e-5)
            _cpu_seconds(ours, x, repeats), _cpu_seconds(theirs, x, repeats)  # warm-up
            ratios, ours_s, theirs_s = [], [], []
            for pair in range(args.pairs):
                first, second = (ours, theirs) if pair % 2 else (theirs, ours)
                times = {id(first): _cpu_seconds(first, x, repeats)}
                times[id(second)] = _cpu_seconds(second, x, repeats)
                ours_s.append(times[id(ours)])
                theirs_s.append(times[id(theirs)])
                ratios.append(times[id(ours)] / times[id(theirs)])
            print(f"{name:28s} XLA={xla!s:5s} TensorFlow {statistics.median(theirs_s) * 1e3:7.3f} ms  "
                  f"keras.ops {statistics.median(ours_s) * 1e3:7.3f} ms  "
                  f"ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
