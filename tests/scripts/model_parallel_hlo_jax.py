"""What Keras' own, kgrad's probed and kgrad's guarded steps move between 8 CPU devices under `ModelParallel`.

Run by tests/jax/test_model_parallel_hlo_jax.py in its own process: the number
of host devices is fixed when JAX starts (``XLA_FLAGS``). A small token model
(an embedding, a multi-head attention, two Dense layers, a vocabulary head)
whose `keras.distribution.LayoutMap` splits kernels on both axes of a
``(2, 4)`` mesh ``["batch", "model"]``, the embedding and the vocabulary on
``model`` and the attention heads on ``model``. Each step of a ``fit`` is
recorded where it is jitted (every jit that donates the state, Keras' and
kgrad's), lowered again for the shapes and shardings it ran with, compiled,
and read: each all-gather, all-to-all and collective-permute of the
compiled HLO with its size per device, each array sent to one device
(``sharding={maximal ...}``), and ``memory_analysis()``. Prints one JSON object;
XLA's warnings ("Involuntary full rematerialization") go to stderr.
"""

import json
import os
import re
import sys

if __name__ == "__main__":  # (pytest imports this file for its doctests: leave its environment alone)
    # XLA flags of the caller's come after (to measure one: docs/sharded.md, "What it costs").
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=8 {os.environ.get('XLA_FLAGS', '')}"
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"  # XLA's warnings (rematerialization) reach stderr
    # Compiled here, never read from a cache (conftest.py shares one across a test run): a program
    # read back from it would compile nothing, and say nothing of rematerialization.
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402

# The test's model, or (KGRAD_HLO_MODEL=large, to measure by hand: docs/sharded.md) one 8x as wide,
# whose weights outweigh the fixed scratch of the statistics.
_SIZES = {"small": (256, 8, 64, 4, 256), "large": (4096, 32, 512, 8, 2048)}
VOCABULARY, LENGTH, WIDTH, HEADS, HIDDEN = _SIZES[os.environ.get("KGRAD_HLO_MODEL", "small")]
rng = np.random.default_rng(0)
tokens = rng.integers(0, VOCABULARY, size=(16, LENGTH)).astype("int32")
targets = rng.integers(0, VOCABULARY, size=(16, LENGTH)).astype("int32")

_DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f64": 8,
                "s64": 8, "u64": 8}
_MOVES = ("all-gather", "all-to-all", "collective-permute")


def layout_map(mesh):
    """Kernels split on both axes (each way round), the embedding and the heads on ``model``."""
    layouts = keras.distribution.LayoutMap(mesh)
    layouts["embedding/embeddings"] = (None, "model")
    layouts["attention/(query|key|value)/kernel"] = (None, "model", None)
    layouts["attention/attention_output/kernel"] = ("model", None, None)
    layouts["up/kernel"] = ("batch", "model")
    layouts["down/kernel"] = ("model", "batch")
    layouts["logits/kernel"] = (None, "model")
    return layouts


def model_parallel():
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], jax.devices())
    return keras.distribution.ModelParallel(layout_map=layout_map(mesh), batch_dim_name="batch")


def build(distribution, kind=keras.Model):
    """The token model, compiled, under ``distribution`` (``kind``: ``keras.Model`` or a subclass)."""
    keras.backend.clear_session()
    keras.distribution.set_distribution(distribution)  # (clear_session unsets it)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((LENGTH,), dtype="int32", name="tokens")
    embedded = keras.layers.Embedding(VOCABULARY, WIDTH, name="embedding")(inputs)
    attended = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name="attention")(embedded, embedded)
    hidden = keras.layers.Dense(HIDDEN, activation="relu", name="up")(attended + embedded)
    down = keras.layers.Dense(WIDTH, name="down")(hidden)
    logits = keras.layers.Dense(VOCABULARY, name="logits")(down)
    model = kind(inputs, logits, name="m")
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _Recorded:
    """A jitted step that remembers the abstract arguments of its first call."""

    def __init__(self, jitted, name, log):
        self._jitted, self._name, self._log = jitted, name, log

    def __call__(self, *args):
        if not any(entry[0] is self for entry in self._log):
            abstract = jax.tree.map(_abstract, args)
            self._log.append((self, self._name, abstract))
        return self._jitted(*args)

    def __getattr__(self, name):
        return getattr(self._jitted, name)


def _abstract(array):
    # An array the step placed nowhere in particular (the guard's record) is placed by the call.
    committed = getattr(array, "_committed", False)
    return jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=array.sharding if committed else None)


def record_steps(log):
    """Wraps ``jax.jit``: each jit that donates its first argument (a train step's state) is recorded."""
    real_jit = jax.jit

    def jit(fun, *args, **kwargs):
        jitted = real_jit(fun, *args, **kwargs)
        # A step: Keras' (the state donated), or the guard's (its spike buffers too).
        if kwargs.get("donate_argnums") in (0, (0, 1)):
            return _Recorded(jitted, getattr(fun, "__qualname__", type(fun).__name__), log)
        return jitted

    jax.jit = jit
    keras.src.backend.jax.trainer.jit = jit


def moves(hlo_text):
    """``[(op, bytes per device, result, op_name)]``: each collective moving elements, or to one device."""
    found = []
    for line in hlo_text.splitlines():
        op = next((op for op in _MOVES if f" {op}(" in line or f" {op}-start(" in line), None)
        maximal = "maximal" in line
        if op is None and not maximal:
            continue
        result = line.split("=", 1)[1] if "=" in line else line
        shapes = re.findall(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]", result.split("(", 1)[0] + "(")
        size = sum(_DTYPE_BYTES.get(dtype, 4) * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
                   for dtype, dims in shapes)
        where = re.search(r'op_name="([^"]*)"', line)
        named = line.split("=", 1)[0].strip() + " = " + result.split("(", 1)[0].strip()
        found.append((op or "maximal", size, named, where.group(1) if where else ""))
    return found


def measure(log):
    """``{step name: {"moves": [...], "memory": {...}}}`` of each recorded step, compiled again."""
    measured = {}
    for recorded, name, abstract in log:
        # The guard's sample step and its plain step are two programs of one name: the first run first.
        name = name if name not in measured else f"{name}#{sum(key.startswith(name) for key in measured) + 1}"
        lowered = recorded._jitted.lower(*abstract)
        compiled = lowered.compile()
        memory = compiled.memory_analysis()
        if os.environ.get("HLO_DUMP_DIR"):  # to read a step by hand
            with open(os.path.join(os.environ["HLO_DUMP_DIR"], f"{name}.txt"), "w") as file:
                file.write(compiled.as_text())
        measured[name] = {
            "moves": moves(compiled.as_text()),
            # Before partitioning: what is placed on one device (a host callback's operands).
            "maximal": [line.strip()[:300] for line in lowered.as_text().splitlines() if "maximal" in line],
            "memory": {
                "temp": memory.temp_size_in_bytes,
                "argument": memory.argument_size_in_bytes,
                "output": memory.output_size_in_bytes,
                "alias": memory.alias_size_in_bytes,
            },
        }
    return measured


def fit(callbacks):
    log = []
    record_steps(log)
    model = build(model_parallel())
    model.fit(tokens, targets, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return measure(log), model


def main():
    keras_steps, model = fit([])
    probe = kgrad.GradientProbe(every_n_steps=1, statistics="all", histograms=True, layers="all",
                                instruments=["optimizer", "logits", "attention"])
    probed_steps, _ = fit([probe])
    guarded_steps, _ = fit([kgrad.NonFiniteGuard()])
    # Two programs: the first step a sample step (spike_sample_every=2), whose program also holds the
    # skip's branch; the second the plain step, with the skip's branch.
    skipping = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=4, spike_warmup=2, spike_sample_every=2)
    skipping_steps, _ = fit([skipping])
    json.dump({
        "devices": len(jax.devices()),
        "shardings": {v.path: str(v.value.sharding.spec) for v in model.trainable_variables},
        "keras": keras_steps, "probed": probed_steps, "guarded": guarded_steps, "skipping": skipping_steps,
    }, sys.stdout)


if __name__ == "__main__":
    main()
