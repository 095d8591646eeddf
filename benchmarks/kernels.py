"""What each kernel of a tensor's summary costs per element, and the alternatives tried.

`benchmarks.profile_ops` says which op types a probed step adds; this says
why the histogram dominates them, and measures the ways of counting buckets
that were tried in its place, on tensors of the sizes the benchmark models
summarize (an MLP activation is 32,768 floats, a CNN activation ~1M).

Each kernel runs inside one ``tf.function`` on ``CALLS`` distinct inputs
(``x + i``: the same input twice would be computed once), with the range of
each input given as a tensor, as a probed step gives it. A reference function
does only the ``x + i``; the kernel's cost is the CPU time of its function
minus the reference's, per element. Kernel and reference take turns; the
median of the per-turn differences is reported (process CPU time, both cores:
see ``shared/BENCHMARKING.md``).

Example (from the repository root; about 20 s, 22 s with the default three sizes)::

    python -m benchmarks.kernels --sizes 32768,1048576
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

#: Buckets per histogram, as `kgrad.GradientProbe` uses by default.
BUCKETS = 30
#: Distinct inputs per function call.
CALLS = 10


def _float32_bucket_index(values, low, high):
    # A float32 index, as kgrad's XLA path computes one (it divides by the
    # bucket width); the top value lands in bucket BUCKETS, folded back.
    return tf.cast((values - low) * (BUCKETS / (high - low)), tf.int32)


def _fold_top(counts):
    return tf.concat([counts[:-2], counts[-2:-1] + counts[-1:]], axis=0)


def _histogram_fixed_width(values, low, high):
    return tf.histogram_fixed_width(values, tf.stack([low, high]), BUCKETS)


def _index_and_bincount(values, low, high):
    index = _float32_bucket_index(values, low, high)
    size = tf.constant(BUCKETS + 1)
    return _fold_top(tf.raw_ops.Bincount(arr=index, size=size, weights=tf.zeros([0], tf.int32)))


def _index_and_segment_sum(values, low, high):
    index = _float32_bucket_index(values, low, high)
    return _fold_top(tf.math.unsorted_segment_sum(tf.ones_like(index), index, BUCKETS + 1))


#: (name, what kgrad uses it for, fn(values, low, high)); the first three count buckets.
KERNELS = (
    ("HistogramFixedWidth", "the histogram (kgrad, outside XLA)", _histogram_fixed_width),
    ("float32 index + Bincount", "tried instead of it", _index_and_bincount),
    # kgrad's XLA path counts with this scatter; here it runs without XLA.
    ("float32 index + UnsortedSegmentSum", "tried instead of it (a scatter)", _index_and_segment_sum),
    ("L2Loss", "the norm", lambda values, low, high: tf.nn.l2_loss(values)),
    ("Sum", "the mean", lambda values, low, high: tf.reduce_sum(values)),
    ("Min", "the min", lambda values, low, high: tf.reduce_min(values)),
    ("Max", "the max", lambda values, low, high: tf.reduce_max(values)),
    ("Sign + L2Loss", "the zero fraction", lambda values, low, high: tf.nn.l2_loss(tf.sign(values))),
)
HISTOGRAM_KERNELS = 3


def _calls(kernel):
    """A function applying ``kernel`` to ``CALLS`` distinct inputs (``kernel=None``: the inputs only)."""

    def run(values, low, high):
        outputs = []
        for i in range(CALLS):
            shifted = values + float(i)
            outputs.append(shifted[0] if kernel is None else kernel(shifted, low + i, high + i))
        return outputs

    return tf.function(run, autograph=False)


def _cpu_seconds(function, arguments, calls):
    start = time.process_time()
    for _ in range(calls):
        function(*arguments)
    return time.process_time() - start


def measure(sizes, repeats, calls_per_turn=10, seed=0):
    """``{kernel name: {size: CPU nanoseconds per element}}``.

    Args:
        sizes: Element counts of the summarized tensor.
        repeats: Turns of kernel and reference per measurement.
        calls_per_turn: Function calls timed in one turn.
        seed: Seed of the normal values summarized.
    """
    generator = tf.random.Generator.from_seed(seed)
    reference = _calls(None)
    result = {name: {} for name, _, _ in KERNELS}
    for size in sizes:
        values = generator.normal([size])
        arguments = (values, tf.reduce_min(values) - 0.01, tf.reduce_max(values) + 0.01)
        functions = [(name, _calls(kernel)) for name, _, kernel in KERNELS]
        for _, function in functions:
            function(*arguments)  # traced, outside the timing
        reference(*arguments)
        for name, function in functions:
            differences = []
            for turn in range(repeats):
                pair = [function, reference] if turn % 2 == 0 else [reference, function]
                times = {id(f): _cpu_seconds(f, arguments, calls_per_turn) for f in pair}
                differences.append(times[id(function)] - times[id(reference)])
            elements = size * CALLS * calls_per_turn
            result[name][size] = statistics.median(differences) / elements * 1e9
    return result


def table(result, sizes):
    """The markdown table of `measure`'s result."""
    header = "| kernel | kgrad uses it for | " + " | ".join(f"{size:,} elements" for size in sizes) + " |"
    lines = [header, "|---|---|" + "---|" * len(sizes)]
    for name, purpose, _ in KERNELS:
        cells = " | ".join(f"{result[name][size]:.2f}" for size in sizes)
        lines.append(f"| `{name}` | {purpose} | {cells} |")
    return "\n".join(lines)


def _positive_ints(text):
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive element counts, e.g. 32768,1048576; received {text!r}"
        )
    return values


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_positive_ints, default=[32768, 131072, 1048576],
                        help="Element counts, comma-separated (default: 32768,131072,1048576).")
    parser.add_argument("--repeats", type=int, default=7, help="Turns per measurement (default: 7).")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1; received {args.repeats}")
    result = measure(args.sizes, args.repeats)
    print("CPU nanoseconds per element (process CPU time, both cores), median over "
          f"{args.repeats} turns; ranges given as tensors, {BUCKETS} buckets:\n")
    print(table(result, args.sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
