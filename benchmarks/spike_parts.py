"""Where TensorFlow's spike rule spends its per-step cost: the guard with ``skip_spikes=True`` taken apart.

The configurations of `benchmarks.spike_cost` (the guard, a second guard as the A/A control,
skipping with no sample after the first step), plus skipping with parts of the rule replaced
while each model's step is traced:

- ``rule_constant``: `SpikeState.decide` returns constants (no spike, no window, no row, no
  write): what is left is the branch structure and the metrics kept for a skipped step;
- ``rule_constant_no_kept_metrics``: the same, and the metrics' variables not kept
  (`forward_state.state_before_step`'s ``keep_metrics``);
- ``rule_constant_no_kept_metrics_cond``: the same, and the guard's two-way ``tf.cond`` for the
  three-way ``tf.switch_case`` (update, sampled update, skip): the guard's own step again;
- ``no_window_statistics``: the rule with the window's mean and σ replaced by constants;
- ``no_kept_metrics``: the rule, without the metrics kept.

These patch kgrad's internals, for measuring only. Printed as `benchmarks.spike_cost` prints:
the median CPU-ms per step and the median per-round ratio to the guard (with its quartiles).

Run: ``python -m benchmarks.spike_parts --model mlp --steps 256 --rounds 13 [--jit-compile]``
(TensorFlow only; about 3 minutes on an idle 2-core machine).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402
from benchmarks.models import MODELS, build_model, make_data  # noqa: E402
from benchmarks.spike_cost import SKIP_FROM, _Clock  # noqa: E402

SKIP = dict(skip_spikes=True, spike_sigmas=1e6, spike_sample_every=10**9)
#: name: (the guard's arguments, the parts replaced while its model's step is traced)
CONFIGS = {
    "guard": ({}, ()),
    "guard_aa": ({}, ()),
    "skip_no_samples": (SKIP, ()),
    "rule_constant": (SKIP, ("rule",)),
    "rule_constant_no_kept_metrics": (SKIP, ("rule", "kept_metrics")),
    "rule_constant_no_kept_metrics_cond": (SKIP, ("rule", "kept_metrics", "switch")),
    "no_window_statistics": (SKIP, ("window_statistics",)),
    "no_kept_metrics": (SKIP, ("kept_metrics",)),
}


def patch(replaced):
    """Patches the step's parts to consult ``replaced`` (a set, changed before each fit)."""
    import tensorflow as tf

    from kgrad.backends.tensorflow.differentiate import forward_state
    from kgrad.backends.tensorflow.guard import sentinel, spikes

    decide, statistics = spikes.SpikeState.decide, spikes.window_statistics
    before_step = forward_state.state_before_step

    def patched_decide(self, loss, weight_squares, may_apply, halt_updates, overflowed=None):
        if "rule" in replaced:
            columns = 2 + self.weights
            judged = (tf.zeros([columns]), tf.constant(False), tf.constant(float("nan")),
                      tf.zeros([columns]), tf.ones([columns]))
            return may_apply, judged, (tf.constant(0, tf.int64), tf.constant(1, tf.int64), tf.constant(False))
        if "window_statistics" in replaced:
            spikes.window_statistics = lambda window, accepted, length: (
                tf.zeros([2 + self.weights]), tf.ones([2 + self.weights]))
        try:
            return decide(self, loss, weight_squares, may_apply, halt_updates, overflowed)
        finally:
            spikes.window_statistics = statistics

    def patched_before_step(model, guard):
        put_back, keep_metrics = before_step(model, guard)
        return put_back, (lambda traced, outputs: outputs) if "kept_metrics" in replaced else keep_metrics

    class Switch:  # sentinel's `tf`, with a two-way cond for the three-way switch when replaced
        def __getattr__(self, name):
            return getattr(tf, name)

        def switch_case(self, index, branches):
            if "switch" in replaced:
                return tf.cond(index < 2, branches[0], branches[2])
            return tf.switch_case(index, branches)

    spikes.SpikeState.decide = patched_decide
    forward_state.state_before_step = patched_before_step
    sentinel.tf = Switch()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=13)
    parser.add_argument("--jit-compile", action="store_true",
                        help="The models compiled with jit_compile=True.")
    args = parser.parse_args()
    if keras.backend.backend() != "tensorflow":
        parser.error(f"TensorFlow only (KERAS_BACKEND is {keras.backend.backend()!r}): "
                     "it patches its spike rule.")
    replaced = set()
    patch(replaced)
    spec = MODELS[args.model]
    x, y = make_data(spec, 50, seed=0)
    repeat = args.steps // 50 + 1
    x = np.concatenate([x] * repeat)[: args.steps * spec.batch_size]
    y = np.concatenate([y] * repeat)[: args.steps * spec.batch_size]
    models = {name: build_model(spec, 0, args.jit_compile) for name in CONFIGS}
    seconds = {name: [] for name in CONFIGS}
    order = list(CONFIGS)
    for turn in range(args.rounds):
        for name in order if turn % 2 == 0 else order[::-1]:
            arguments, parts = CONFIGS[name]
            replaced.clear()
            replaced.update(parts)
            clock = _Clock()
            models[name].fit(x, y, batch_size=spec.batch_size, shuffle=False, verbose=0,
                             callbacks=[kgrad.NonFiniteGuard(**arguments), clock])
            if turn:  # the first round traces
                seconds[name].append(clock.seconds / (args.steps - SKIP_FROM))
    guard = np.array(seconds["guard"])
    compiled = ", jit_compile=True" if args.jit_compile else ""
    print(f"tensorflow {args.model}{compiled}, {args.steps} steps a fit, {args.rounds - 1} rounds timed")
    for name, values in seconds.items():
        ratios = np.array(values) / guard
        print(f"{name}: {1e3 * np.median(values):.3f} CPU-ms/step, ratio to guard {np.median(ratios):.3f} "
              f"(quartiles {np.percentile(ratios, 25):.3f}-{np.percentile(ratios, 75):.3f})")


if __name__ == "__main__":
    main()
