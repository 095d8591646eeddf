"""False alarms of spike rules on clean runs: each step's loss and gradient norm, judged offline.

Two steps. ``record`` trains each clean setup once with
``NonFiniteGuard(skip_spikes=True, spike_sigmas=1e30)`` (the guard's step as
it runs, nothing skipped) and keeps the loss and global gradient norm that the
device's rule judged at every step, as they are (the backend's ``judge`` is wrapped to copy
them out: TensorFlow into a device buffer read at the end, JAX through
``jax.debug.callback``); ``table`` then judges every series with each
candidate rule in NumPy (k = 6, N = 128, a full window's warm-up; a flagged
step leaves the window as a skipped step does; the trajectory is the clean
one, so a count above 0 is approximate after the first flag, 0 is exact).

Run (each backend in its own process, then the table of both):

    KERAS_BACKEND=tensorflow python -m benchmarks.spike_false_alarms record /tmp/spikes_tf.npz
    KERAS_BACKEND=jax python -m benchmarks.spike_false_alarms record /tmp/spikes_jax.npz
    python -m benchmarks.spike_false_alarms table /tmp/spikes_tf.npz /tmp/spikes_jax.npz
"""

import argparse
import os
import sys

import numpy as np

SIGMAS, WINDOW = 6.0, 128


def _regression(activation, batch, inputs, steps=2000, seed=11):
    import keras

    rng = np.random.default_rng(seed)
    draw = (lambda size: rng.uniform(-2, 2, size=size)) if inputs == "uniform" else rng.normal
    x = draw(size=(steps * batch, 8)).astype("float32")
    y = (np.sin(x[:, :1]) + 0.1 * rng.normal(size=(steps * batch, 1))).astype("float32")
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation=activation), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.Adam(1e-3), "mse", steps_per_execution=20)
    return model, dict(x=x, y=y, batch_size=batch, shuffle=True)


def _demo(run):
    import keras

    from kgrad import demo

    x, y = demo.make_circle_data(4096)
    keras.utils.set_random_seed(list(demo.MODELS).index(run) + 1)
    model = demo.build_mlp(*demo.MODELS[run])
    return model, dict(x=x, y=y, batch_size=32, epochs=20, validation_split=0.2)


def _example_transient(seed):
    """examples/spike_skipping.py's fault-free run, 5 epochs (2000 steps)."""
    import keras

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import spike_skipping

    (x, y), _ = spike_skipping.regression_data(seed, fault=False)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(32, activation="tanh"),
         keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.Adam(1e-3), "mse", steps_per_execution=20)
    return model, dict(x=x, y=y, batch_size=32, epochs=5, shuffle=True)


def _memorizing_mlp(steps=1000):
    """The benchmarks' MLP on its 50 batches of random labels: a loss that falls for good (a trend)."""

    from benchmarks.models import MODELS, build_model, make_data

    spec = MODELS["mlp"]
    x, y = make_data(spec, 50, seed=0)
    model = build_model(spec, seed=0, jit_compile="auto")
    return model, dict(x=np.tile(x, (steps // 50, 1)), y=np.tile(y, steps // 50),
                       batch_size=spec.batch_size, shuffle=False)


def _example_lasting(seed):
    """examples/spike_skipping.py's lasting instability: the tiny GPT-2, learning rate x100 from step 50."""
    import keras

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import instability

    keras.utils.set_random_seed(seed)
    inputs, targets = instability.make_data(seed)
    model = instability.build_model()
    schedule = instability.RaiseAt(instability.LEARNING_RATE, instability.RAISE_STEP, instability.FACTOR)
    model.compile(optimizer=keras.optimizers.Adam(schedule),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), weighted_metrics=[])
    return model, dict(x=inputs, y=targets, batch_size=instability.BATCH, shuffle=False)


#: Runs with a lasting instability from step `RAISE` on, judged with a window of `LASTING_WINDOW`
#: (as the example): the first flagged step, and its loss against the mean of the 5 before the raise.
LASTING = {f"example lasting, seed {seed}": (lambda seed=seed: _example_lasting(seed)) for seed in range(8)}
RAISE, LASTING_WINDOW = 50, 32

SETUPS = {
    "demo relu_deep (SGD, batch 32)": lambda: _demo("relu_deep"),
    "demo sigmoid_deep (SGD, batch 32)": lambda: _demo("sigmoid_deep"),
    "ReLU, normal inputs, batch 4": lambda: _regression("relu", 4, "normal"),
    "ReLU, normal inputs, batch 16": lambda: _regression("relu", 16, "normal"),
    "ReLU, normal inputs, batch 64": lambda: _regression("relu", 64, "normal"),
    "ReLU, uniform inputs, batch 32": lambda: _regression("relu", 32, "uniform"),
    "tanh, uniform inputs, batch 32": lambda: _regression("tanh", 32, "uniform"),
    "example transient, fault-free, seed 0": lambda: _example_transient(0),
    "example transient, fault-free, seed 1": lambda: _example_transient(1),
    "benchmark MLP, random labels memorized (1000 steps)": _memorizing_mlp,
}


def _recorded(build):
    """``[steps, 2]``: the loss and global gradient norm the guard's rule judged at each step."""
    import keras

    import kgrad

    model, fit = build()
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_sigmas=1e30)
    if keras.backend.backend() == "jax":
        import jax

        from kgrad.backends.jax.guard import spikes

        seen, original = [], spikes.judge

        def judge(record, rule, loss, weight_squares):
            values = jax.numpy.stack([loss.astype("float32"), jax.numpy.sqrt(jax.numpy.sum(weight_squares))])
            jax.debug.callback(lambda step, v: seen.append((int(step), np.array(v))),
                               record.row_count, values)
            return original(record, rule, loss, weight_squares)

        spikes.judge = judge
        try:
            model.fit(**fit, verbose=0, callbacks=[guard])
            jax.effects_barrier()
        finally:
            spikes.judge = original
        return np.array([v for _, v in sorted(seen, key=lambda s: s[0])], np.float64)
    import tensorflow as tf

    from kgrad.backends.tensorflow.guard import spikes
    from kgrad.backends.tensorflow.handover.replicas import state_variable

    buffers, original = [], spikes.SpikeState.judge

    def judge(self, loss, weight_squares):
        judged = original(self, loss, weight_squares)
        if not hasattr(self, "_seen"):
            with tf.init_scope():
                self._seen = state_variable(tf.zeros([1 << 16, 2]), "spike_false_alarms_seen")
            buffers.append(self._seen)
        values = tf.stack([tf.cast(loss, tf.float32), tf.sqrt(tf.reduce_sum(weight_squares))])
        self._seen.scatter_nd_update([[self.row_count % (1 << 16)]], [values])
        return judged

    spikes.SpikeState.judge = judge
    try:
        model.fit(**fit, verbose=0, callbacks=[guard])
    finally:
        spikes.SpikeState.judge = original
    steps = len(guard._spikes.logs[None].rows)
    return buffers[0].numpy()[:steps].astype(np.float64)


def record(path, only=None):
    import keras

    series = {}
    for name, build in {**SETUPS, **LASTING}.items():
        if only and only not in name:
            continue
        series[name] = _recorded(build)
        print(f"{keras.backend.backend()} {name}: {len(series[name])} steps", flush=True)
    np.savez(path, backend=keras.backend.backend(), **series)


# The candidate rules: each maps the window ([n, 2] accepted values) and the step's values to
# the step's score (the largest of the two columns' scores; > SIGMAS spikes).

def _z(window, values, centre, scale):
    scale = np.where(scale > 0, scale, np.inf)
    return float(np.max((values - centre) / scale))


def raw(window, values):
    return _z(window, values, window.mean(0), window.std(0, ddof=1))


def _logs(a):
    return np.log(np.maximum(a, np.finfo(np.float32).tiny))


def log(window, values):
    """The logarithms of the loss and the gradient norm (all positive here)."""
    return raw(_logs(window), _logs(values))


def log_floor(scale):
    def rule(window, values):
        logs = _logs(window)
        return _z(logs, _logs(values), logs.mean(0), np.maximum(logs.std(0, ddof=1), scale))

    rule.__name__ = f"log, σ ≥ {scale:g}"
    return rule


def median_mad(window, values):
    median = np.median(window, 0)
    return _z(window, values, median, 1.4826 * np.median(np.abs(window - median), 0))


def log_median_mad(window, values):
    return median_mad(_logs(window), _logs(values))


def floor(fraction):
    def rule(window, values):
        mean = window.mean(0)
        return _z(window, values, mean, np.maximum(window.std(0, ddof=1), fraction * mean))

    rule.__name__ = f"floor σ ≥ {fraction:g}·mean"
    return rule


def _trend(window, values):
    """The window's least-squares line, extrapolated one step; σ of the residuals."""
    t = np.arange(len(window), dtype=np.float64)
    t_mean = t.mean()
    slope = ((t - t_mean)[:, None] * (window - window.mean(0))).sum(0) / np.square(t - t_mean).sum()
    fitted = window.mean(0) + slope * (t - t_mean)[:, None]
    residual = (window - fitted).std(0, ddof=2)
    return _z(window, values, window.mean(0) + slope * (len(window) - t_mean), residual)


def trend(window, values):
    return _trend(window, values)


def log_trend(window, values):
    return _trend(_logs(window), _logs(values))


RULES = (raw, log, log_floor(0.05), median_mad, log_median_mad, floor(0.5), trend, log_trend)


def flagged(series, rule, sigmas=SIGMAS, window=WINDOW):
    """Steps the rule flags on ``series``; a flagged step stays out of the window, as a skipped one."""
    accepted, steps = [], []
    for step, values in enumerate(series):
        if len(accepted) >= window and rule(np.array(accepted[-window:]), values) > sigmas:
            steps.append(step)
            continue
        accepted.append(values)
    return steps


def table(paths):
    """Markdown tables: false alarms per setup and rule; the lasting instability's first flagged step."""
    series = {}
    for path in paths:  # a later file's series replaces an earlier one's
        data = np.load(path)
        series.update({(str(data["backend"]), name): data[name] for name in data.files if name != "backend"})
    names = [getattr(rule, "__name__", str(rule)) for rule in RULES]
    print("| setup | backend | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for (backend, name), values in sorted(series.items(), key=lambda item: (item[0][1], item[0][0])):
        if name not in SETUPS:
            continue
        counts = []
        for rule in RULES:
            steps = flagged(values, rule)
            counts.append(f"{len(steps)}" + (f" (first {steps[0]})" if steps else ""))
        print(f"| {name} | {backend} | " + " | ".join(counts) + " |", flush=True)
    print(f"\nLasting instability (window {LASTING_WINDOW}): first flagged step, "
          f"its loss / the 5 before step {RAISE}")
    print("| run | backend | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for (backend, name), values in sorted(series.items(), key=lambda item: (item[0][1], item[0][0])):
        if name not in LASTING:
            continue
        before = values[RAISE - 5 : RAISE, 0].mean()
        cells = []
        for rule in RULES:
            steps = flagged(values, rule, window=LASTING_WINDOW)
            cells.append(f"{steps[0]} ({values[steps[0], 0] / before:.2f}x)" if steps else "none")
        print(f"| {name} | {backend} | " + " | ".join(cells) + " |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description="False alarms of candidate spike rules on clean runs.")
    commands = parser.add_subparsers(dest="command", required=True)
    record_command = commands.add_parser("record", help="train the clean runs, save what the guard judged")
    record_command.add_argument("path", help="the .npz file to write")
    record_command.add_argument("only", nargs="?", help="only the setups whose name contains this")
    table_command = commands.add_parser("table", help="the tables of flagged steps, from recorded files")
    table_command.add_argument("paths", nargs="+", help=".npz files written by `record`")
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.path, args.only)
    else:
        table(args.paths)


if __name__ == "__main__":
    main()
