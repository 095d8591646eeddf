"""What probing and guarding cost on a model split over devices (`keras.distribution.ModelParallel`).

Run with ``KERAS_BACKEND=jax python -m benchmarks.sharded [--devices 8] [--pairs 5] [--steps 50]``.
The benchmark transformer (`benchmarks.models`, at ``--width`` features) under a
`keras.distribution.ModelParallel` whose `LayoutMap` splits every kernel on the ``model``
axis of a ``(2, devices / 2)`` mesh ``["batch", "model"]`` (the attention's heads, the
feed-forward's hidden features, the head's inputs) and the batch on ``batch``. Every
configuration against plain sharded ``fit``, in interleaved pairs in one process, as
`benchmarks.jax_overhead` times one device: the median CPU-time and wall-time ratios,
with an A/A control. On a CPU the devices are simulated (``XLA_FLAGS``, set before JAX
starts); on a machine with several GPUs they are the GPUs, and with fewer than
``--devices`` accelerators the run says so and stops. What the compiled steps gather and
their memory per device: ``python tests/scripts/model_parallel_hlo_jax.py`` (docs/sharded.md).

Example (a check that it runs, 2 simulated devices, seconds):

    KERAS_BACKEND=jax python -m benchmarks.sharded --devices 2 --pairs 1 --steps 4 --width 32
"""

import argparse
import os
import sys

CONFIGS = ("baseline_aa", "probe_n100", "probe_n10", "probe_n1", "guard")


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8, help="Devices of the mesh (even; 8: a (2, 4) mesh).")
    parser.add_argument("--pairs", type=int, default=5, help="Timed pairs per configuration.")
    parser.add_argument("--steps", type=int, default=50, help="Steps per timed fit (one sample).")
    parser.add_argument("--width", type=int, default=256,
                        help="Features of the transformer (its heads, key size and hidden width scale with it).")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"Comma-separated, among {', '.join(CONFIGS)}.")
    parser.add_argument("--out", default=None, help="Write the results as JSON to this file.")
    args = parser.parse_args(argv)
    if args.devices < 2 or args.devices % 2:
        parser.error(f"--devices must be an even number of at least 2. Received: --devices {args.devices}.")
    unknown = sorted(set(args.configs.split(",")) - set(CONFIGS))
    if unknown:
        parser.error(f"--configs: unknown {unknown}; expected some of {list(CONFIGS)}.")
    if args.width % 8 or args.width < 8 * args.devices // 2:
        parser.error(f"--width must be a multiple of 8 and at least 4 x --devices (the heads are split over the "
                     f"model axis). Received: --width {args.width} with --devices {args.devices}.")
    if os.environ.get("KERAS_BACKEND") != "jax":
        parser.error("run with KERAS_BACKEND=jax: the sharded models are keras.distribution's, on JAX.")
    return args


def sharded_transformer_spec(width):
    """`benchmarks.models.ModelSpec` of the benchmark transformer at ``width`` features, 8 heads."""
    import keras

    from benchmarks.models import CLASSES, ModelSpec

    def build():
        inputs = keras.Input((16, width))
        hidden = keras.layers.Dense(width, name="embed")(inputs)
        attention = keras.layers.MultiHeadAttention(num_heads=8, key_dim=width // 8, name="attention")(hidden, hidden)
        hidden = keras.layers.LayerNormalization(name="norm_1")(hidden + attention)
        feed_forward = keras.layers.Dense(4 * width, activation="gelu", name="ffn_in")(hidden)
        feed_forward = keras.layers.Dense(width, name="ffn_out")(feed_forward)
        hidden = keras.layers.LayerNormalization(name="norm_2")(hidden + feed_forward)
        pooled = keras.layers.GlobalAveragePooling1D()(hidden)
        outputs = keras.layers.Dense(CLASSES, activation="softmax", name="head")(pooled)
        return keras.Model(inputs, outputs, name="sharded_transformer")

    description = (f"transformer block, {width} features, 8 heads, FFN {4 * width}, on 16x{width}; batch 32, "
                   "ModelParallel")
    return ModelSpec("sharded_transformer", description, (16, width), 32, build)


def model_parallel(devices):
    """`ModelParallel` on a ``(2, devices / 2)`` mesh: each kernel split on ``model``, the batch on ``batch``."""
    import keras

    mesh = keras.distribution.DeviceMesh((2, len(devices) // 2), ["batch", "model"], devices)
    layouts = keras.distribution.LayoutMap(mesh)
    layouts["embed/kernel"] = (None, "model")
    layouts["attention/(query|key|value)/kernel"] = (None, "model", None)
    layouts["attention/attention_output/kernel"] = ("model", None, None)
    layouts["ffn_in/kernel"] = (None, "model")
    layouts["ffn_out/kernel"] = ("model", None)
    layouts["head/kernel"] = ("model", None)
    return keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")


def main(argv=None):
    args = _parse(argv)
    # JAX fixes the number of host devices when it starts: simulated CPU devices, set first.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}").strip()
    import jax
    import keras

    from benchmarks import jax_overhead

    devices = jax.devices()
    if len(devices) < args.devices:
        print(f"benchmarks.sharded: {len(devices)} {devices[0].platform} device(s), fewer than --devices "
              f"{args.devices}: nothing measured. On a CPU the devices are simulated; on GPUs, use a machine "
              "with several.", file=sys.stderr)
        return 3
    devices = devices[: args.devices]
    keras.distribution.set_distribution(model_parallel(devices))
    spec = sharded_transformer_spec(args.width)
    print(f"kgrad on JAX {jax.__version__}, Keras {keras.__version__}; {len(devices)} x {devices[0].device_kind} "
          f"({devices[0].platform}), mesh (2, {len(devices) // 2}); {spec.description}; {args.pairs} pairs of "
          f"{args.steps} steps", flush=True)
    results = jax_overhead.run_model(spec, args.pairs, args.steps, configs=args.configs.split(","))
    if args.out:
        import json

        with open(args.out, "w") as file:
            json.dump({"devices": len(devices), "platform": devices[0].platform, "width": args.width,
                       "pairs": args.pairs, "steps": args.steps, "results": results}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
