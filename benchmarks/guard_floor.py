"""What a non-finite check of every watched tensor costs, whoever writes it.

`kgrad.NonFiniteGuard` checks, every step, every input, activation,
dJ/d(activation) and weight gradient (one sum of squares each) and skips the
update of a bad step (one ``tf.cond``). This script times, against Keras' own
step and in the same process, hand-written steps that do only parts of that,
so that RESULTS.md can say how much of the guard's cost is the design's
floor on this machine:

- ``reductions``: Keras' step, plus the sum of squares of the same tensors
  the guard watches by default (under `kgrad.ProbeTape`), stored in a
  variable; the update is always applied (no branch).
- ``trivial_cond``: Keras' step plus one ``tf.cond`` whose branches return
  constants (what any branch in the step costs on its own).
- ``reductions_cond``: ``reductions`` with the update inside a ``tf.cond`` on
  the result: the least a guard that skips bad updates can do.
- ``guard``: Keras' step under `kgrad.NonFiniteGuard()`.

Each variant runs ``--steps`` steps per sample through ``model.train_function``
(the logs read back each step, as ``fit`` does), the variants take turns
sample by sample, and a variant's figure is the median over ``--rounds`` of
its CPU time divided by the plain step's in the same round.

Run: ``python -m benchmarks.guard_floor --model mlp`` (about a minute).
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kgrad  # noqa: E402
from benchmarks.models import MODELS, make_data, make_dataset  # noqa: E402
from kgrad import install  # noqa: E402

VARIANTS = ("plain", "reductions", "trivial_cond", "reductions_cond", "guard")


def _checked_step(model, flag, variant):
    """A ``train_step`` for ``variant`` (Keras' own, plus parts of a guard)."""

    def train_step(data):
        x, y = data
        with kgrad.ProbeTape(model, persistent=True) as tape:
            y_pred = model(x, training=True)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, training=True)
        model._loss_tracker.update_state(loss, sample_weight=tf.shape(x)[0])
        weights = model.trainable_weights
        gradients = tape.gradient(loss, weights)
        probe = tape.probe
        watched = [x, loss, *probe.activations.values(), *probe.gradients.values(), *gradients]
        squares = tf.stack([tf.nn.l2_loss(t) for t in watched])
        finite = tf.reduce_all(tf.math.is_finite(squares))
        flag.assign(tf.logical_not(finite))

        def apply():
            model.optimizer.apply_gradients(zip(gradients, weights))
            return tf.constant(True)

        if variant == "reductions_cond":
            tf.cond(finite, apply, lambda: tf.constant(False))
        else:
            apply()
        return model.compute_metrics(x, y, y_pred)

    return train_step


def _trivial_cond_step(model):
    keras_step = type(model).train_step

    def train_step(data):
        logs = keras_step(model, data)
        tf.cond(model.optimizer.iterations >= 0, lambda: tf.constant(1.0), lambda: tf.constant(0.0))
        return logs

    return train_step


def _train_function(spec, variant, x, y):
    """A compiled model's train function for ``variant``, traced and warmed up."""
    keras.utils.set_random_seed(0)
    model = spec.build()
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x[: spec.batch_size], y[: spec.batch_size], batch_size=spec.batch_size, verbose=0)
    if variant in ("reductions", "reductions_cond"):
        flag = tf.Variable(False)
        object.__setattr__(model, "train_step", _checked_step(model, flag, variant))
        model.make_train_function(force=True)
    elif variant == "trivial_cond":
        object.__setattr__(model, "train_step", _trivial_cond_step(model))
        model.make_train_function(force=True)
    elif variant == "guard":
        install.attach(model, "guard", kgrad.NonFiniteGuard().config)
    return model.train_function


def measure(model_name, rounds, steps):
    """``{variant: median CPU ratio to plain}`` and the plain step's CPU-ms."""
    spec = MODELS[model_name]
    x, y = make_data(spec, 20, seed=0)
    runners = {}
    for variant in VARIANTS:
        function = _train_function(spec, variant, x, y)
        iterator = iter(make_dataset(spec, x, y))
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
    ratios = {variant: float(np.median(np.array(seconds[variant]) / plain)) for variant in VARIANTS}
    return ratios, float(np.median(plain)) / steps * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20, help="Steps per sample.")
    args = parser.parse_args(argv)
    ratios, plain_ms = measure(args.model, args.rounds, args.steps)
    print(
        f"{args.model}: plain step {plain_ms:.2f} CPU-ms; "
        f"median CPU ratio to plain over {args.rounds} rounds"
    )
    for variant, ratio in ratios.items():
        print(f"  {variant:16s} {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
