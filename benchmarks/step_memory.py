"""Per-device memory of the compiled steps (JAX): Keras' own against kgrad's probe and guard.

What one device holds while a step runs, from XLA's own buffer assignment
(``compiled.memory_analysis()``: temporaries + arguments + outputs, less the
donated): the number issue 52 bounds (Keras' step + 5%, + the statistics for
a probe) and issue 53 asks of every step. The model is an MLP
1024-2048-1024 (kernels of 2**21 elements), batch 64, Adam: on one device
(``--layouts one``), with its kernels split on both axes of a ``(2,
devices / 2)`` mesh (``split``: `keras.distribution.ModelParallel`), or whole
on every device (``data_parallel``). tests/jax/test_step_memory_jax.py
checks issue 52's bounds on the last two.

``--region-analysis on`` compiles kgrad's steps with XLA's region analysis in
copy insertion on this platform (CPU or GPU) even where kgrad would not
(`kgrad.backends.jax.handover.train_function.KGRAD_STEP_COMPILER_OPTIONS`:
CPU, where a weight is split); ``off``, never. Measured on CPU devices it
removed a copy of every old kernel shard on a split model and added one on
one device (docs/sharded.md); a GPU is not measured yet
(`benchmarks/gpu_jax.sh` runs this on one).

Run (about 20 s on 2 CPU cores)::

    KERAS_BACKEND=jax python -m benchmarks.step_memory
    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax \\
        python -m benchmarks.step_memory --layouts split,data_parallel --region-analysis off
"""

import argparse
import json
import os
import sys

# Imported by tests/jax/test_step_memory_benchmark_jax.py: leave the test run's environment alone.
if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402
from kgrad.backends.jax.handover import train_function  # noqa: E402

_REGION_ANALYSIS = {"cpu": "xla_cpu_copy_insertion_use_region_analysis",
                    "gpu": "xla_gpu_copy_insertion_use_region_analysis"}
CONFIGS = {
    "keras": lambda: [],
    "default probe": lambda: [kgrad.GradientProbe(every_n_steps=1)],
    "every statistic + optimizer": lambda: [
        kgrad.GradientProbe(every_n_steps=1, statistics="all", instruments=["optimizer"])],
    "guard": lambda: [kgrad.NonFiniteGuard()],
}


LAYOUTS = ("one", "split", "data_parallel")


def _distribute(layout):
    """Sets the ``keras.distribution`` of ``layout`` (``"one"``: none)."""
    devices = jax.devices()
    if layout == "split":  # keys of whole paths: a functional model's (a Sequential's start "sequential/")
        mesh = keras.distribution.DeviceMesh((2, len(devices) // 2), ["batch", "model"], devices)
        layouts = keras.distribution.LayoutMap(mesh)
        layouts["up/kernel"], layouts["down/kernel"] = ("batch", "model"), ("model", "batch")
        keras.distribution.set_distribution(
            keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch"))
    elif layout == "data_parallel":
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))


def step_memory(callbacks, layout):
    """``memory_analysis()`` of the one step a fit of the MLP compiles (the state-donating jit), in
    bytes per device (``temp``, ``argument``, ``output``, ``alias``, ``per_device``), and ``shards``:
    the shape of each kernel's shard on the first device."""
    keras.backend.clear_session()
    _distribute(layout)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((1024,))
    hidden = keras.layers.Dense(2048, activation="relu", name="up")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1024, name="down")(hidden))
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    x = np.random.default_rng(0).normal(size=(64, 1024)).astype("float32")
    steps = []
    real_jit = jax.jit

    def recording_jit(fun, *args, **kwargs):
        jitted = real_jit(fun, *args, **kwargs)
        if kwargs.get("donate_argnums") not in (0, (0, 1)):  # not a train step
            return jitted

        def call(*call_args):
            steps.append(jitted.lower(*call_args).compile().memory_analysis())
            return jitted(*call_args)

        return call

    jax.jit = keras.src.backend.jax.trainer.jit = recording_jit
    try:
        model.fit(x, x, batch_size=64, epochs=1, verbose=0, callbacks=callbacks)
    finally:
        jax.jit = keras.src.backend.jax.trainer.jit = real_jit
        keras.distribution.set_distribution(None)
    memory = steps[0]
    measured = {"temp": memory.temp_size_in_bytes, "argument": memory.argument_size_in_bytes,
                "output": memory.output_size_in_bytes, "alias": memory.alias_size_in_bytes}
    measured["per_device"] = measured["temp"] + measured["argument"] + measured["output"] - measured["alias"]
    measured["shards"] = {variable.path: list(variable.value.addressable_shards[0].data.shape)
                          for variable in model.trainable_variables if variable.path.endswith("kernel")}
    return measured


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="one",
                        help=f"Comma-separated, of {', '.join(LAYOUTS)} (default: one).")
    parser.add_argument("--region-analysis", choices=["auto", "on", "off"], default="auto",
                        help="XLA's region analysis in copy insertion for kgrad's steps (default: kgrad's).")
    parser.add_argument("--out", help="Also write the results as JSON to this file.")
    args = parser.parse_args(argv)
    if keras.backend.backend() != "jax":
        parser.error(f"it measures JAX's compiled steps; Keras' backend is {keras.backend.backend()!r}. "
                     "Run it with KERAS_BACKEND=jax.")
    layouts = args.layouts.split(",")
    if not set(layouts) <= set(LAYOUTS):
        parser.error(f"--layouts takes {', '.join(LAYOUTS)}, comma-separated. Received: {args.layouts!r}.")
    if set(layouts) - {"one"} and len(jax.devices()) < 2:
        parser.error(f"--layouts {args.layouts} needs 2 devices or more; this process has "
                     f"{len(jax.devices())} (XLA_FLAGS=--xla_force_host_platform_device_count=8 on CPU).")
    if args.region_analysis == "off":
        train_function.KGRAD_STEP_COMPILER_OPTIONS = {}
    elif args.region_analysis == "on":
        train_function.KGRAD_STEP_COMPILER_OPTIONS = {
            platform: {option: True} for platform, option in _REGION_ANALYSIS.items()}
        train_function.splits_a_weight = lambda model: True
    results = {"platform": jax.devices()[0].platform, "devices": len(jax.devices()),
               "region_analysis": args.region_analysis, "layouts": {}}
    for layout in layouts:
        measured = {name: step_memory(make(), layout) for name, make in CONFIGS.items()}
        results["layouts"][layout] = measured
        keras_step = measured["keras"]["per_device"]
        print(f"{results['platform']}, {results['devices']} device(s), {layout}, region analysis "
              f"{args.region_analysis}: bytes per device, ratio to Keras' step")
        for name, memory in measured.items():
            print(f"  {name:30s} {memory['per_device']:>14,d}  {memory['per_device'] / keras_step:.4f}")
    if args.out:
        with open(args.out, "w") as file:
            json.dump(results, file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
