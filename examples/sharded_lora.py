"""kgrad on a model split over 8 devices: a tiny KerasHub Gemma tuned with LoRA under `ModelParallel`.

KerasHub's guide to tuning Gemma on JAX splits the model over an 8-device mesh
with `keras.distribution.ModelParallel` and the backbone's own `LayoutMap`
(`GemmaBackbone.get_layout_map`: the token embedding, the query, key, value and
feed-forward kernels split on a ``model`` axis), enables LoRA of rank 4, and calls
plain `fit`. This script does the same with every kgrad instrument on, on a
2-layer Gemma built from a config (nothing is downloaded, no tokenizer: it is fed
made-up token ids), on 8 simulated CPU devices, a ``(2, 4)`` mesh
``["batch", "model"]``:

- a `kgrad.GradientProbe` with ``statistics="all"``, histograms and the
  ``optimizer``, ``logits`` (the vocabulary is split: Gemma's output is its
  split token embedding) and ``attention`` (the heads are split) instruments, on
  every step; ``"per_example"`` too, if kgrad accepts it here (it prints why not);
- a `kgrad.NonFiniteGuard`.

Only the LoRA weights train (``enable_lora`` freezes the rest), so the probe logs
their gradients; the attention instrument logs each head. Each statistic is
reduced where its shards live: nothing is gathered onto one device
(docs/sharded.md).

Run: ``python examples/sharded_lora.py [LOG_DIR]`` (under a minute on 2 CPU
cores), then ``kgrad report LOG_DIR``. The number of devices is fixed when JAX
starts: run it as its own process, on the JAX backend (it sets both).
"""

import os
import sys
import tempfile

if __name__ == "__main__":  # (a test imports `build` and `data`: leave its environment alone)
    # 8 simulated CPU devices: set before JAX starts.
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402

VOCABULARY, LENGTH, BATCH, STEPS, RANK = 64, 8, 8, 3, 4


def build(distribution):
    """The tiny Gemma causal LM, LoRA rank 4, compiled, under ``distribution`` (None: one device)."""
    import keras_hub  # (imports TensorFlow: only here)

    keras.backend.clear_session()
    keras.distribution.set_distribution(distribution)  # (clear_session unsets it)
    keras.utils.set_random_seed(0)
    # Heads and vocabulary divisible by the 4 devices of the model axis, widths by the 2 of the batch axis.
    backbone = keras_hub.models.GemmaBackbone(vocabulary_size=VOCABULARY, num_layers=2, num_query_heads=4,
                                              num_key_value_heads=4, hidden_dim=16, intermediate_dim=64,
                                              head_dim=8)
    backbone.enable_lora(RANK)
    model = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=[])
    return model


def model_parallel():
    """``ModelParallel`` over a ``(2, 4)`` mesh with the backbone's own layout map."""
    import keras_hub

    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], jax.devices())
    layout_map = keras_hub.models.GemmaBackbone.get_layout_map(mesh, model_parallel_dim_name="model",
                                                               data_parallel_dim_name="batch")
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def data():
    """``(inputs, next tokens)``: made-up token ids, no padding; ``STEPS`` batches of ``BATCH``."""
    ids = np.random.default_rng(0).integers(1, VOCABULARY, size=(STEPS * BATCH, LENGTH + 1)).astype("int32")
    inputs = {"token_ids": ids[:, :-1], "padding_mask": np.ones((len(ids), LENGTH), "int32")}
    return inputs, ids[:, 1:]


def main(log_dir):
    model = build(model_parallel())
    instruments = ["optimizer", "logits", "attention", "per_example"]
    try:
        probe = kgrad.GradientProbe(log_dir, every_n_steps=1, statistics="all", histograms=True,
                                    instruments=instruments)
    except ValueError as error:
        print(f"per_example: {error}")
        instruments.remove("per_example")
        probe = kgrad.GradientProbe(log_dir, every_n_steps=1, statistics="all", histograms=True,
                                    instruments=instruments)
    guard = kgrad.NonFiniteGuard()
    inputs, targets = data()
    model.fit(inputs, targets, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[probe, guard])

    embedding = model.backbone.get_layer("token_embedding").embeddings
    print(f"devices: {len(jax.devices())}, token embedding {tuple(embedding.shape)} split as "
          f"{embedding.value.sharding.spec}")
    print("trained:", ", ".join(w.path for w in model.trainable_weights))
    scalars = kgrad.read_logs(log_dir)["kgrad"]["scalars"]
    for tag in sorted(scalars):
        if tag.startswith("weight_grad_norm/") and "lora" in tag or tag.startswith("attention_entropy/"):
            print(f"{tag}: " + " ".join(f"{v:.4g}" for v in scalars[tag].values))
    print(f"guard: {'tripped' if guard.report else 'no trip'}")
    print(f"logs: {log_dir}; see them with: kgrad report {log_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="sharded_lora_"))
