"""Programs compiled and CPU time of un-jitted fits (``jit_compile=False``) on JAX, with and without kgrad.

A step run op by op compiles each operation the first time it meets its shape; a
``lax.cond`` built in a call compiles at every call. kgrad's own computations are
compiled calls of their own (`kgrad.backends.jax.summarize.compiled`), so the
programs they add are few, and none in a second fit of the same shapes. For each
configuration this fits a two-layer MLP twice (2 epochs of 4 steps), each time with
a new callback, and prints the programs JAX lowered (its monitoring events) and the
process CPU seconds of each fit. The first plain fit warms Keras' own operations.

Run (about a minute on 2 cores)::

    KERAS_BACKEND=jax python -m benchmarks.op_by_op
"""

import contextlib
import os
import tempfile
import time

# Imported by tests/jax/test_op_by_op_jax.py: leave the test run's environment alone.
if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402

LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"
CONFIGS = {
    "plain fit": lambda folder: None,
    "GradientProbe(every_n_steps=1)": lambda folder: kgrad.GradientProbe(folder, every_n_steps=1),
    "the same, statistics='all', optimizer and logits instruments": lambda folder: kgrad.GradientProbe(
        folder, every_n_steps=1, statistics="all", instruments=["optimizer", "logits"]),
    "NonFiniteGuard()": lambda folder: kgrad.NonFiniteGuard(),
    "NonFiniteGuard(skip_spikes=True)": lambda folder: kgrad.NonFiniteGuard(skip_spikes=True),
}


@contextlib.contextmanager
def programs_lowered():
    """``[count]`` of the programs JAX lowers inside the block (a persistent-cache hit counts too).

    Example (inside, ``count[0]`` grows with each program lowered)::

        with programs_lowered() as count:
            fit(None)
    """
    count = [0]

    def listener(event, duration, **kwargs):
        del duration, kwargs
        count[0] += event == LOWERED

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def fit(callback):
    """CPU seconds of one un-jitted fit (2 epochs of 4 steps) of a two-layer MLP, with ``callback``."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy", jit_compile=False)
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    start = time.process_time()
    model.fit(x, np.arange(64) % 3, batch_size=16, epochs=2, verbose=0,
              callbacks=[] if callback is None else [callback])
    return time.process_time() - start


def _measured(callback):
    with programs_lowered() as count:
        seconds = fit(callback)
    return f"{count[0]}, {seconds:.2f}"


def main():
    if keras.backend.backend() != "jax":
        raise SystemExit("benchmarks.op_by_op measures JAX's op-by-op steps: run it with KERAS_BACKEND=jax.")
    # No persistent cache: the CPU seconds are those of a first run (a program read from it is
    # lowered all the same, and counted).
    jax.config.update("jax_enable_compilation_cache", False)
    fit(None)  # Keras' own operations, once
    print("| configuration | first fit: programs, CPU-s | second fit: programs, CPU-s |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="kgrad-op-by-op-") as folder:
        for number, (name, make) in enumerate(CONFIGS.items()):
            first = _measured(make(os.path.join(folder, f"{number}-first")))
            second = _measured(make(os.path.join(folder, f"{number}-second")))
            print(f"| {name} | {first} | {second} |", flush=True)


if __name__ == "__main__":
    main()
