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
- ``sums_branch_unlowered``: the same with the ``tf.cond`` kept as one
  ``If`` op that calls its branch as a function, instead of being lowered
  into the step's graph (TensorFlow's default outside XLA).
- ``sums_snapshot``: the update applied at once, as Keras' own step does,
  after a copy of every weight and optimizer variable, restored in a
  branch when the sums are not finite: a guard that does not make the
  update wait for the check, paying a copy of the training state instead.
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

Run: ``python -m benchmarks.guard_floor --model mlp`` (about 90 s);
``--variants sums,sums_branch,guard`` times a subset beside plain and copy
(the MobileNet's 40 rounds of all of them take about 4 minutes).
"""

import argparse
import dataclasses
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import attr_value_pb2  # noqa: E402

import kgrad  # noqa: E402
from benchmarks.models import MODELS, make_data, make_dataset  # noqa: E402
from benchmarks.timing import median_interval  # noqa: E402
from kgrad.backends.tensorflow.differentiate import install  # noqa: E402

VARIANTS = (
    "plain", "copy", "sums_unordered", "sums", "sums_branch", "sums_branch_unlowered", "sums_snapshot",
    "guard",
)


def _unlowered_cond(pred, true_fn, false_fn):
    """``tf.cond``, its ``If`` op marked not to be lowered into Switch and Merge nodes."""
    graph = tf.compat.v1.get_default_graph()
    known = len(graph.get_operations())
    tf.cond(pred, true_fn, false_fn)
    for op in graph.get_operations()[known:]:
        if op.type in ("If", "StatelessIf"):
            op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))


def _apply_after_snapshot(model, snapshots, finite, apply):
    """Copies the training state, applies the update at once, restores the copy if not ``finite``."""
    state = [*model.trainable_weights, *model.optimizer.variables]
    if not snapshots:  # first trace: one copy variable per state variable
        with tf.init_scope():
            snapshots.extend(tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in state)
    if len(snapshots) != len(state):
        raise ValueError(
            "sums_snapshot needs the optimizer's variables before its step is traced "
            f"({len(snapshots)} copies for {len(state)} variables): fit the model for one step first."
        )
    copies = [copy.assign(variable) for copy, variable in zip(snapshots, state)]
    with tf.control_dependencies(copies):
        apply()

    def restore():
        for copy, variable in zip(snapshots, state):
            variable.assign(copy)
        return tf.no_op()

    # The same variables: automatic control dependencies order this after the update.
    _unlowered_cond(finite, tf.no_op, restore)


def _checked_step(model, flag, variant):
    """Keras' ``train_step`` plus the sentinel's sums, and the update as ``variant`` says."""
    snapshots = []

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
        elif variant == "sums_branch_unlowered":
            _unlowered_cond(finite, apply, tf.no_op)
        elif variant == "sums_snapshot":
            _apply_after_snapshot(model, snapshots, finite, apply)
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


def _unknown_variants(variants):
    """What is wrong with ``variants`` (a message), or ``None``."""
    unknown = sorted(set(variants) - set(VARIANTS))
    if not unknown:
        return None
    return f"received unknown {unknown}; expected some of {', '.join(VARIANTS[2:])}, comma-separated."


def measure(model_name, rounds, steps, variants=VARIANTS):
    """The `Measurement` of ``variants`` (with ``plain`` and ``copy``) on ``model_name``."""
    problem = _unknown_variants(variants)
    if problem:
        raise ValueError(f"variants: {problem}")
    variants = ("plain", "copy", *(v for v in VARIANTS[2:] if v in variants))
    spec = MODELS[model_name]
    x, y = make_data(spec, 20, seed=0)
    runners = {}
    for variant in variants:
        function = _train_function(spec, variant, x, y)
        iterator = iter(make_dataset(spec, x, y).repeat())
        for _ in range(3):  # first calls after tracing cost more
            function(iterator)
        runners[variant] = (function, iterator)
    seconds = {variant: [] for variant in variants}
    for round_index in range(rounds):
        order = variants if round_index % 2 == 0 else variants[::-1]
        for variant in order:
            function, iterator = runners[variant]
            start = time.process_time()
            for _ in range(steps):
                # Keras converts the logs to Python numbers after each step.
                {key: float(value) for key, value in function(iterator).items()}
            seconds[variant].append(time.process_time() - start)
    plain = np.array(seconds["plain"])
    per_round = {variant: np.array(seconds[variant]) / plain for variant in variants}
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
    parser.add_argument(
        "--variants", default=",".join(VARIANTS[2:]),
        help=f"Comma-separated, beside plain and copy; some of {', '.join(VARIANTS[2:])}.",
    )
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    problem = _unknown_variants(variants)
    if problem:
        parser.error(f"--variants: {problem}")
    result = measure(args.model, args.rounds, args.steps, variants)
    print(
        f"{args.model}: plain step {result.plain_ms:.2f} CPU-ms; median CPU ratio to plain "
        f"over {args.rounds} rounds of {args.steps} steps [bootstrap 95% interval]"
    )
    for variant in list(result.ratios)[1:]:
        low, high = result.intervals[variant]
        print(f"  {variant:21s} {result.ratios[variant]:.3f} [{low:.3f}-{high:.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
