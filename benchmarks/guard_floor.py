"""What the sentinel of `kgrad.NonFiniteGuard` costs per step, and what any such check must cost.

The default guard checks, every step, the loss and every weight gradient
(one sum of squares each) and skips the update of a step where one is not
finite (a ``tf.cond``). This script times, against Keras' own step and in the
same process, hand-written steps that do only parts of that, so that
RESULTS.md can say how much of the guard's cost is the design's floor:

- ``copy``: Keras' own step on an identical second model (the A/A control:
  what two identical functions differ by in this process).
- ``sums_unordered``: Keras' step plus the sentinel's sums of squares,
  stored in a variable, the update not waiting for them: what their ops cost.
- ``sums``: the same with the update applied after the sums (no branch):
  what waiting for every gradient's check before any update costs.
- ``sums_branch``: ``sums`` with the update inside a ``tf.cond`` on the
  sums being finite: the least a guard that skips bad updates can do.
- ``guard``: Keras' step under `kgrad.NonFiniteGuard()`.

Each variant runs ``--steps`` steps per sample through ``model.train_function``
(the logs read back each step, as ``fit`` does); the variants take turns
sample by sample, in alternating order, and a variant's figure is the median
over ``--rounds`` of its CPU time divided by the plain step's in the same
round, with a bootstrap 95% interval of that median. Short samples taken in
turn share the machine's state (a core that vanishes for a second hits every
variant alike), which is why this resolves differences of ~1% where whole
``fit`` runs (`benchmarks.run`) spread by ±5%; the medians of separate runs
still move by ~±0.015, so compare variants within one run, and repeat it.

Run: ``python -m benchmarks.guard_floor --model mlp`` (about 90 s).
"""

import argparse
import dataclasses
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kgrad  # noqa: E402
from benchmarks.models import MODELS, make_data, make_dataset  # noqa: E402
from benchmarks.timing import median_interval  # noqa: E402
from kgrad import install  # noqa: E402

VARIANTS = ("plain", "copy", "sums_unordered", "sums", "sums_branch", "guard")


def _checked_step(model, flag, variant):
    """Keras' ``train_step`` plus the sentinel's sums, and the update as ``variant`` says."""

    def train_step(data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, training=True)
        model._loss_tracker.update_state(loss, sample_weight=tf.shape(x)[0])
        weights = model.trainable_weights
        gradients = tape.gradient(loss, weights)
        squares = tf.stack([tf.nn.l2_loss(t) for t in (loss, *gradients)])
        finite = tf.reduce_all(tf.math.is_finite(squares))
        flag.assign(tf.logical_not(finite))

        def apply():
            model.optimizer.apply_gradients(zip(gradients, weights))
            return tf.no_op()

        if variant == "sums_branch":
            tf.cond(finite, apply, tf.no_op)
        elif variant == "sums":
            with tf.control_dependencies([finite]):
                apply()
        else:
            apply()
        return model.compute_metrics(x, y, y_pred)

    return train_step


def _train_function(spec, variant, x, y):
    """A compiled model's train function for ``variant``, traced and warmed up."""
    keras.utils.set_random_seed(0)
    model = spec.build()
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x[: spec.batch_size], y[: spec.batch_size], batch_size=spec.batch_size, verbose=0)
    if variant.startswith("sums"):
        flag = tf.Variable(False)
        object.__setattr__(model, "train_step", _checked_step(model, flag, variant))
        model.make_train_function(force=True)
    elif variant == "guard":
        install.attach(model, "guard", kgrad.NonFiniteGuard().config)
    return model.train_function


@dataclasses.dataclass(frozen=True)
class Measurement:
    """``ratios[variant]``: median CPU ratio to plain; ``intervals[variant]``: its 95% interval."""

    ratios: dict
    intervals: dict
    plain_ms: float  # the plain step's median CPU time


def measure(model_name, rounds, steps):
    """The `Measurement` of every variant of ``VARIANTS`` on ``model_name``."""
    spec = MODELS[model_name]
    x, y = make_data(spec, 20, seed=0)
    runners = {}
    for variant in VARIANTS:
        function = _train_function(spec, variant, x, y)
        iterator = iter(make_dataset(spec, x, y).repeat())
        for _ in range(3):  # first calls after tracing cost more
            function(iterator)
        runners[variant] = (function, iterator)
    seconds = {variant: [] for variant in VARIANTS}
    for round_index in range(rounds):
        order = VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            function, iterator = runners[variant]
            start = time.process_time()
            for _ in range(steps):
                # Keras converts the logs to Python numbers after each step.
                {key: float(value) for key, value in function(iterator).items()}
            seconds[variant].append(time.process_time() - start)
    plain = np.array(seconds["plain"])
    per_round = {variant: np.array(seconds[variant]) / plain for variant in VARIANTS}
    return Measurement(
        ratios={variant: float(np.median(values)) for variant, values in per_round.items()},
        intervals={variant: median_interval(values) for variant, values in per_round.items()},
        plain_ms=float(np.median(plain)) / steps * 1e3,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10, help="Steps per sample.")
    args = parser.parse_args(argv)
    result = measure(args.model, args.rounds, args.steps)
    print(
        f"{args.model}: plain step {result.plain_ms:.2f} CPU-ms; median CPU ratio to plain "
        f"over {args.rounds} rounds of {args.steps} steps [bootstrap 95% interval]"
    )
    for variant in VARIANTS[1:]:
        low, high = result.intervals[variant]
        print(f"  {variant:14s} {result.ratios[variant]:.3f} [{low:.3f}-{high:.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
