"""Skipping spiking steps, with and without, over several seeds: a transient fault and a lasting one.

(a) **A transient fault.** A small MLP learns y = sin(x₀) + noise (400 steps of 32
examples, Adam 1e-3); the inputs of steps 250 and 251 are scaled ×1000 (a bad shard,
a unit error; fewer than ``max_skips`` = 3 in a row, which would stop training).
Without skipping, Adam's moments take the fault's huge gradients
and training needs many steps to recover; with ``NonFiniteGuard(skip_spikes=True)``
the three steps are skipped. Printed: the mean training loss of the 10 steps
after the fault, the final loss on clean held-out data, and the fault-free run's.

(b) **A lasting one.** The tiny GPT-2 of examples/instability.py, whose learning
rate is raised ×100 at step 50 and stays there. Skipping cannot save it: the
guard (a window of 32 steps, so that it judges before step 50) should stop
after ``max_skips`` skips in a row and name what moved, before the loss has
doubled. Printed: the steps skipped, the loss when it stopped (and before the
raise), the last loss of the run without skipping, and what the guard named.

Run: ``python examples/spike_skipping.py --seeds 8`` (a few minutes on 2 CPU cores).
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import instability  # noqa: E402 (the tiny GPT-2, its data and its learning-rate raise)
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402

STEPS, BATCH, FAULT, FAULT_STEPS, SCALE = 400, 32, 250, 2, 1000.0


def regression_data(seed, fault):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(STEPS * BATCH + 2048, 8)).astype("float32")
    y = (np.sin(x[:, :1]) + 0.1 * rng.normal(size=(len(x), 1))).astype("float32")
    train, held_out = (
        (x[: STEPS * BATCH].copy(), y[: STEPS * BATCH]),
        (x[STEPS * BATCH :], y[STEPS * BATCH :]),
    )
    if fault:
        train[0][FAULT * BATCH : (FAULT + FAULT_STEPS) * BATCH] *= SCALE
    return train, held_out


def _loss_recorder(averages):
    return keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: averages.append(logs["loss"])
    )


def per_step_losses(averages):
    """Each step's loss from Keras' running mean of the epoch."""
    averages = np.asarray(averages, np.float64)
    counts = np.arange(1, len(averages) + 1)
    return averages * counts - np.concatenate([[0.0], averages[:-1] * counts[:-1]])


def transient(seed, fault, skip):
    """``(loss of the 10 steps after the fault, final held-out loss, skipped steps)``."""
    (x, y), (x_test, y_test) = regression_data(seed, fault)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(32, activation="tanh"),
            keras.layers.Dense(32, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    averages = []
    callbacks = [_loss_recorder(averages)]
    guard = kgrad.NonFiniteGuard(skip_spikes=True) if skip else None
    model.fit(
        x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=callbacks + ([guard] if guard else [])
    )
    after = per_step_losses(averages)[FAULT + FAULT_STEPS : FAULT + FAULT_STEPS + 10].mean()
    final = float(model.evaluate(x_test, y_test, verbose=0))
    return after, final, [] if guard is None else [s.step for s in guard.skipped_steps]


def lasting(seed, skip):
    """``(steps skipped, loss before the raise, loss at the end (or of the kept weights), the stop report,
    the largest loss after the raise)``."""
    keras.utils.set_random_seed(seed)
    inputs, targets = instability.make_data(seed)
    model = instability.build_model()
    schedule = instability.RaiseAt(instability.LEARNING_RATE, instability.RAISE_STEP, instability.FACTOR)
    model.compile(
        optimizer=keras.optimizers.Adam(schedule),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[],
    )
    averages = []
    callbacks = [_loss_recorder(averages)]
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=32) if skip else None
    model.fit(
        inputs,
        targets,
        batch_size=instability.BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=callbacks + ([guard] if guard else []),
    )
    losses = per_step_losses(averages)
    before = losses[instability.RAISE_STEP - 5 : instability.RAISE_STEP].mean()
    end = float(losses[-1])
    peak = float(losses[instability.RAISE_STEP :].max())
    if guard is None:
        return [], before, end, None, peak
    report = guard.spike_report
    # The loss of the last step whose update was applied: the weights the guard kept.
    kept = int(model.optimizer.iterations)
    return [s.step for s in guard.skipped_steps], before, float(losses[kept - 1]), report, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="how many seeds (0, 1, ...) to run each case on")
    parser.add_argument("--case", choices=("transient", "lasting", "both"), default="both")
    args = parser.parse_args()
    seeds = range(args.seeds)
    if args.case in ("transient", "both"):
        print(f"(a) transient fault: inputs x{SCALE:g} at steps {FAULT}-{FAULT + FAULT_STEPS - 1}")
        print("seed | clean final | no skip: after, final | skip: after, final, skipped | skip/clean")
        within = 0
        for seed in seeds:
            _, clean, _ = transient(seed, fault=False, skip=False)
            after_plain, final_plain, _ = transient(seed, fault=True, skip=False)
            after_skip, final_skip, skipped = transient(seed, fault=True, skip=True)
            within += final_skip <= 1.2 * clean
            print(
                f"{seed} | {clean:.4f} | {after_plain:.4g}, {final_plain:.4f} | {after_skip:.4g}, "
                f"{final_skip:.4f}, {skipped} | {final_skip / clean:.3f}",
                flush=True,
            )
        print(
            f"skipping kept the final loss within 1.2x of the fault-free run on {within} of "
            f"{len(seeds)} seeds"
        )
    if args.case in ("lasting", "both"):
        print("(b) lasting instability: learning rate x100 from step 50 (tiny GPT-2)")
        for seed in seeds:
            _, before, end_plain, _, peak = lasting(seed, skip=False)
            skipped, _, end_skip, report, _ = lasting(seed, skip=True)
            stopped = "stopped" if report is not None else "did not stop"
            print(
                f"seed {seed}: loss before the raise {before:.3f}; no skip: last loss {end_plain:.3f}, "
                f"largest {peak:.3f} ({peak / before:.2f}x); "
                f"skip: skipped {skipped}, {stopped}, loss of the kept weights {end_skip:.3f} "
                f"({end_skip / before:.2f}x)",
                flush=True,
            )
            if report is not None and report.leaders:
                print(f"  named: {report.leaders}", flush=True)


if __name__ == "__main__":
    main()
