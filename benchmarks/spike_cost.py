"""CPU time per step of the guard with ``skip_spikes=True`` against the guard alone, interleaved.

One process, one model per configuration (the benchmarks' models, `benchmarks.models`, the same
seed and 50 batches repeated), each ``fit`` of ``--steps`` steps timed with ``time.process_time``
from step 30 on (its trace and first steps left out). The configurations take turns (A B C,
C B A, ...); the first round is a warm-up. Printed: the median CPU-ms per step and the median
per-round ratio to the guard, beside a second guard (the A/A control). At
``spike_sigmas=1e6``: the rule costs the same at any k, and the benchmark MLP memorizes
(benchmarks/RESULTS.md).

``--inline`` (TensorFlow) adds ``skip_inline``: the skip's measure traced inline in the skipped
branch, as before it became a call of its own (`SpikeState.record_skip`).

``--inter-op-threads N`` (TensorFlow) sizes the executor's inter-op thread pool.

``--jit-compile`` (TensorFlow) compiles the models with ``jit_compile=True``.

Run: ``python -m benchmarks.spike_cost --model transformer --steps 200 --rounds 7 [--inline]``
(``KERAS_BACKEND=jax`` for JAX; a few minutes on 2 loaded cores).
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402
from benchmarks.models import MODELS, build_model, make_data  # noqa: E402

SKIP_FROM = 30


class _Clock(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == SKIP_FROM:
            self.start, self.wall_start = time.process_time(), time.perf_counter()

    def on_train_end(self, logs=None):
        self.seconds = time.process_time() - self.start
        self.wall = time.perf_counter() - self.wall_start


def _inline_while(flag):
    """Patches `SpikeState.record_skip` to trace the measure inline while ``flag[0]``."""
    from kgrad.backends.tensorflow.guard.spikes import SpikeState

    as_call = SpikeState.record_skip

    def record_skip(self, kept, *args, **kwargs):
        if not flag[0]:
            return as_call(self, kept, *args, **kwargs)
        import tensorflow as tf

        tf.cond(kept, lambda: self.measure_skip(*args, **kwargs) or tf.no_op(), tf.no_op)

    SpikeState.record_skip = record_skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--inline", action="store_true")
    parser.add_argument("--no-samples", action="store_true",
                        help="Also time skipping with no sample of the update after the first step "
                             "(spike_sample_every=10**9): the samples' share of the cost.")
    parser.add_argument("--jit-compile", action="store_true",
                        help="TensorFlow: the models compiled with jit_compile=True (XLA; JAX's steps "
                             "are always jitted).")
    parser.add_argument("--inter-op-threads", type=int, default=None,
                        help="TensorFlow: the inter-op thread pool's size (with one thread the rule "
                             "cost about as much: see benchmarks/RESULTS.md).")
    args = parser.parse_args()
    if args.inter_op_threads is not None:
        import tensorflow as tf

        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    spec = MODELS[args.model]
    x, y = make_data(spec, 50, seed=0)
    repeat = args.steps // 50 + 1
    x = np.concatenate([x] * repeat)[: args.steps * spec.batch_size]
    y = np.concatenate([y] * repeat)[: args.steps * spec.batch_size]
    skip = dict(skip_spikes=True, spike_sigmas=1e6)
    configs = {"guard": {}, "guard_aa": {}, "skip": skip}
    if args.no_samples:
        configs["skip_no_samples"] = dict(skip, spike_sample_every=10**9)
    inline = [False]
    if args.inline:
        configs["skip_inline"] = skip
        _inline_while(inline)
    # JAX's own step is jitted; TensorFlow on CPU runs a graph unless --jit-compile.
    jit = keras.backend.backend() == "jax" or args.jit_compile
    models = {name: build_model(spec, 0, jit) for name in configs}
    seconds = {name: [] for name in configs}
    walls = {name: [] for name in configs}
    order = list(configs)
    for turn in range(args.rounds):
        for name in order if turn % 2 == 0 else order[::-1]:
            inline[0] = name == "skip_inline"
            clock = _Clock()
            models[name].fit(x, y, batch_size=spec.batch_size, shuffle=False, verbose=0,
                             callbacks=[kgrad.NonFiniteGuard(**configs[name]), clock])
            if turn:
                seconds[name].append(clock.seconds / (args.steps - SKIP_FROM))
                walls[name].append(clock.wall / (args.steps - SKIP_FROM))
    guard, guard_wall = np.array(seconds["guard"]), np.array(walls["guard"])
    print(f"{keras.backend.backend()} {args.model}, {args.steps} steps a fit, {args.rounds - 1} rounds timed")
    for name, values in seconds.items():
        print(f"{name}: {1e3 * np.median(values):.3f} CPU-ms/step, "
              f"ratio to guard {np.median(np.array(values) / guard):.3f} "
              f"(wall time: {np.median(np.array(walls[name]) / guard_wall):.3f})")


if __name__ == "__main__":
    main()
