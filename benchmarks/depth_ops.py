"""The ops a probed step adds, by depth: MLPs of 4, 16 and 32 hidden layers (issue 53).

A probed step that runs its own small ops per layer pays a kernel launch per op
(TensorFlow without XLA, any GPU), and its cost grows with depth even where its
arithmetic does not. This counts, for each depth, the ops of the plain and of
the probed step (``GradientProbe(layers="all", every_n_steps=1)``, default
statistics and histograms, or the probe of ``--config``):

- TensorFlow: the nodes of the traced ``train_step``'s graph, and those of the
  functions it calls (each function once: its shared summary functions and
  branches), counted apart. Counting needs no timing.
- JAX (``KERAS_BACKEND=jax``): the fusions and other kernels in the entry
  computation of the compiled step, from XLA's dump of its optimized HLO (the
  largest module compiled during ``fit``), each depth in a process of its own.
  Not validated yet: on 2026-12-06 it found the same counts for the plain and
  the probed step at 4 layers (the probed step is not the largest module
  there, or is not dumped), so its table is not a measurement.

Run (about a minute a depth on 2 cores)::

    python -m benchmarks.depth_ops --depths 4,16,32
    KERAS_BACKEND=jax python -m benchmarks.depth_ops --depths 4,16,32
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402

BATCH = 128
WIDTH = 256


def deep_mlp(depth):
    """The benchmark MLP (784-depth×256-10) with ``depth`` hidden layers."""
    layers = [keras.Input((784,))]
    layers += [keras.layers.Dense(WIDTH, activation="relu") for _ in range(depth)]
    layers += [keras.layers.Dense(10, activation="softmax")]
    return keras.Sequential(layers, name=f"mlp_{depth}")


def _fit(depth, callbacks):
    keras.utils.set_random_seed(0)
    model = deep_mlp(depth)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", jit_compile=False)
    rng = np.random.default_rng(0)
    x = rng.random((2 * BATCH, 784), dtype=np.float32)
    y = rng.integers(0, 10, 2 * BATCH)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=callbacks)
    return model


def _probe(log_dir, options):
    return kgrad.GradientProbe(log_dir, layers="all", every_n_steps=1, **options)


def tensorflow_ops(depth, options=None):
    """``{"plain": counts, "probed": counts}`` at ``depth``, as `graph_op_counts` gives them."""
    import tensorflow as tf  # noqa: PLC0415 (the JAX run has no use for it)

    class _Trace(keras.callbacks.Callback):
        # While fit runs, the model's train_step is the probed one (kgrad
        # installs it for the fit): traced again here, on the batch's specs.
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                specs = (tf.TensorSpec([BATCH, 784]), tf.TensorSpec([BATCH], tf.int64))
                step = tf.function(lambda x, y: self.model.train_step((x, y)), autograph=False)
                self.graph = step.get_concrete_function(*specs).graph.as_graph_def()

    counts = {}
    for name in ("plain", "probed"):
        trace = _Trace()
        with tempfile.TemporaryDirectory(prefix="kgrad-depth-") as log_dir:
            probe = [_probe(log_dir, options or {})] if name == "probed" else []
            _fit(depth, probe + [trace])
        counts[name] = graph_op_counts(trace.graph)
    return counts


def graph_op_counts(graph_def):
    """``(graph ops, ops in the functions it calls, XLA-compiled functions)`` of a GraphDef.

    A function compiled by XLA (``jit_compile=True``) runs as one launch
    whatever its ops: it counts once, in the third number, not by its ops.
    """
    compiled = [
        function for function in graph_def.library.function
        if function.attr["_XlaMustCompile"].b
    ]
    called = sum(
        len(function.node_def) for function in graph_def.library.function if function not in compiled
    )
    return len(graph_def.node), called, len(compiled)


_ENTRY = re.compile(r"^ENTRY .*?\{\n(.*?)\n\}", re.S | re.M)
_NOT_A_KERNEL = ("parameter(", "constant(", "get-tuple-element(", "tuple(", "bitcast(")


def hlo_kernels(text):
    """``(fusions, other kernels)`` in the entry computation of an optimized HLO module."""
    entry = _ENTRY.search(text)
    lines = entry.group(1).splitlines() if entry else []
    fusions = sum(" fusion(" in line for line in lines)
    others = sum(
        not any(marker in line for marker in _NOT_A_KERNEL) and " fusion(" not in line
        for line in lines
        if "=" in line
    )
    return fusions, others


def _jax_child(depth, probed, dump_dir, options):
    # A process of its own: XLA reads its dump flags once.
    environment = dict(os.environ, KERAS_BACKEND="jax")
    environment["XLA_FLAGS"] = f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text"
    environment.pop("JAX_COMPILATION_CACHE_DIR", None)  # a program read from a cache is not dumped
    command = [sys.executable, "-m", "benchmarks.depth_ops", "--jax-child", str(depth)]
    command += ["--probed", "--options", json.dumps(options)] if probed else []
    subprocess.run(command, check=True, env=environment)
    modules = glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))
    # The train step is the largest module compiled during fit.
    largest = max(modules, key=os.path.getsize)
    with open(largest) as file:
        return hlo_kernels(file.read())


def jax_kernels(depth, options=None):
    """``{"plain": (fusions, others), "probed": (fusions, others)}`` at ``depth``."""
    counts = {}
    for name in ("plain", "probed"):
        with tempfile.TemporaryDirectory(prefix="kgrad-hlo-") as dump_dir:
            counts[name] = _jax_child(depth, name == "probed", dump_dir, options or {})
    return counts


def table(backend, rows):
    """Markdown rows: depth, plain, probed, extra, extra relative to the shallowest depth."""
    unit = (
        "graph ops (+ in called functions, + XLA-compiled functions)"
        if backend == "tensorflow" else "HLO fusions (+ other kernels)"
    )
    lines = [f"| depth | plain step, {unit} | probed step | extra | extra / extra at {rows[0][0]} |"]
    lines.append("|---|---|---|---|---|")
    first = None
    for depth, counts in rows:
        plain, probed = counts["plain"], counts["probed"]
        extra = sum(probed) - sum(plain)
        first = first or extra
        lines.append(
            f"| {depth} | {_counts(plain)} | {_counts(probed)} | {extra} | "
            + (f"{extra / first:.2f} |" if first else "– |")
        )
    return "\n".join(lines)


def _counts(counts):
    return f"{counts[0]}" + "".join(f" (+{count})" for count in counts[1:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="4,16,32", help="Hidden layers of each MLP, comma-separated.")
    parser.add_argument("--options", default="{}",
                        help="GradientProbe options as JSON, e.g. '{\"histograms\": false}'.")
    parser.add_argument("--jax-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--probed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    options = json.loads(args.options)
    if args.jax_child is not None:
        with tempfile.TemporaryDirectory(prefix="kgrad-depth-") as log_dir:
            _fit(args.jax_child, [_probe(log_dir, options)] if args.probed else [])
        return 0
    try:
        depths = [int(depth) for depth in args.depths.split(",")]
    except ValueError:
        parser.error(f"--depths must be comma-separated integers, e.g. 4,16,32. Received: {args.depths!r}.")
    backend = keras.backend.backend()
    count = tensorflow_ops if backend == "tensorflow" else jax_kernels
    rows = [(depth, count(depth, options)) for depth in depths]
    print(table(backend, rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
