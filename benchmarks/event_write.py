"""Time to append one record to an event file: kgrad's TensorFlow-free framing against TensorFlow's writer.

A large model's probed step writes a ~200 KB record on every logged step; the
target (issue 40) is a write no slower than ``tf.io.TFRecordWriter``'s
(~0.1 ms for 200 KB). Both write to the same kind of local file, interleaved,
median of the per-pair ratios (shared/BENCHMARKING.md); CPU time and wall time.

Run: ``python -m benchmarks.event_write [--size 200000] [--pairs 21]``.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np


def _time_writes(writer, record, count):
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        writer.write(record)
    writer.flush()
    return (time.perf_counter() - wall) / count, (time.process_time() - cpu) / count


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=200_000, help="record size in bytes")
    parser.add_argument("--pairs", type=int, default=21, help="interleaved A/B pairs")
    parser.add_argument("--writes", type=int, default=500, help="records per sample")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from kgrad.logs.event_file import RecordFile

    record = np.random.default_rng(0).bytes(args.size)
    folder = tempfile.mkdtemp()
    ours_file = open(os.path.join(folder, "ours"), "wb")
    ours = RecordFile(ours_file)
    theirs = tf.io.TFRecordWriter(os.path.join(folder, "theirs"))
    _time_writes(ours, record, 20), _time_writes(theirs, record, 20)  # warm-up
    ours_ms, theirs_ms, ratios, cpu_ratios = [], [], [], []
    for pair in range(args.pairs):
        order = (ours, theirs) if pair % 2 == 0 else (theirs, ours)
        times = {id(writer): _time_writes(writer, record, args.writes) for writer in order}
        ours_ms.append(times[id(ours)][0] * 1e3)
        theirs_ms.append(times[id(theirs)][0] * 1e3)
        ratios.append(times[id(ours)][0] / times[id(theirs)][0])
        cpu_ratios.append(times[id(ours)][1] / times[id(theirs)][1])
    ours.close()
    theirs.close()
    shutil.rmtree(folder)
    print(f"record of {args.size} bytes, {args.pairs} pairs of {args.writes} writes:")
    print(f"  kgrad RecordFile         median {statistics.median(ours_ms):.4f} ms per write")
    print(f"  tf.io.TFRecordWriter     median {statistics.median(theirs_ms):.4f} ms per write")
    print(f"  ratio kgrad / TensorFlow median wall {statistics.median(ratios):.3f}, "
          f"CPU {statistics.median(cpu_ratios):.3f}")


if __name__ == "__main__":
    main()
