"""Log-magnitude counts of sharded tensors, counted where the shards live, on 8 CPU devices.

Run by tests/jax/test_sharded_counts_jax.py in its own process: the number of
host devices is fixed when JAX starts (``XLA_FLAGS``). Prints one JSON object:

- ``shapes``: for tensors of several shapes split on a ``(2, 4)`` mesh
  ``["batch", "model"]`` each way (evenly and not, one dimension on both axes,
  replicated over an axis), the counts of
  `kgrad.backends.jax.summarize.sharded_counts.counted_where_they_live` and
  the number of all-gathers and all-reduces of the compiled program;
- ``fits``: the log-magnitude histograms of two probed fits of the token model
  of tests/scripts/model_parallel_hlo_jax.py under `ModelParallel`, every
  tensor counted by the shards' reduction (the threshold lowered to 1
  element), then every tensor scattered (the threshold above every size).
"""

import json
import os
import re
import sys

if __name__ == "__main__":  # (pytest imports this file for its doctests: leave its environment alone)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import kgrad  # noqa: E402
from kgrad.backends.jax.summarize import log_histograms  # noqa: E402
from kgrad.backends.jax.summarize.sharded_counts import counted_where_they_live  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from histogram_reference import hard_values  # noqa: E402
from model_parallel_hlo_jax import build, model_parallel, targets, tokens  # noqa: E402

#: (shape, how it is split): evenly, unevenly (XLA pads the last shards), one dimension on both
#: axes, replicated over "model", three dimensions.
SPLITS = [
    ((16, 8), ("batch", "model")),
    ((10, 6), ("batch", "model")),
    ((7, 9), ("model", "batch")),
    ((13, 5), (("batch", "model"), None)),
    ((8, 12), (None, ("model", "batch"))),
    ((16, 8), ("batch", None)),
    ((60,), ("model",)),
    ((4, 3, 5), (None, "batch", "model")),
]


def collectives(compiled_text):
    return {op: len(re.findall(rf" {op}(-start)?\(", compiled_text)) for op in ("all-gather", "all-reduce")}


def split_counts():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("batch", "model"))
    values = hard_values(seed=4)
    measured = []
    for shape, spec in SPLITS:
        flat = values[: int(np.prod(shape))].copy()
        # Spread over the shards: NaN, ±Inf, ±0 and a subnormal, which count nowhere or as 0.
        flat[:: max(1, flat.size // 6)][:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40]
        tensor = jnp.asarray(flat.reshape(shape))
        sharding = NamedSharding(mesh, PartitionSpec(*spec))
        count = jax.jit(lambda x, s=sharding: counted_where_they_live(
            log_histograms.counts_by_reduction, jax.lax.with_sharding_constraint(x, s)))
        measured.append({
            "shape": shape, "spec": repr(spec), "values": np.asarray(tensor).ravel().tolist(),
            "counts": np.asarray(count(tensor)).tolist(),
            "collectives": collectives(count.lower(tensor).compile().as_text()),
        })
    return measured


def probed_histograms(threshold):
    log_histograms.COUNTED_IN_ONE_REDUCTION_FROM = threshold
    model = build(model_parallel())
    records = []
    probe = kgrad.GradientProbe(every_n_steps=1, on_probe=records.append, layers="all")
    model.fit(tokens, targets, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[probe])
    return [{tag: np.asarray(histogram)[:, 2].tolist() for tag, histogram in record.histograms.items()}
            for record in records]


def main():
    log_histograms.COUNTED_IN_ONE_REDUCTION_FROM = 2**17
    json.dump({"shapes": split_counts(),
               "fits": {"reduced": probed_histograms(1), "scattered": probed_histograms(2**62)}}, sys.stdout)


if __name__ == "__main__":
    main()
