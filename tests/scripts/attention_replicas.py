"""One probed ``fit`` of a MultiHeadAttention model under MirroredStrategy (2 logical CPU devices).

Run as a script (``python attention_replicas.py OUT.npz``) by
tests/test_attention_instrument.py: logical devices must be configured before
TensorFlow initialises any device. Writes the attention layer's input and
weights before the step and the probe's attention tags.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(out_path):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np

    import kgrad

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keras.utils.set_random_seed(0)
    ids = np.random.default_rng(0).integers(1, 20, size=(8, 6)).astype("int32")
    with strategy.scope():
        tokens = keras.Input((6,), dtype="int32")
        embedded = keras.layers.Embedding(20, 8, name="embed")(tokens)
        attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")
        pooled = keras.layers.GlobalAveragePooling1D()(attention(embedded, embedded, use_causal_mask=True))
        model = keras.Model(tokens, keras.layers.Dense(1)(pooled))
        model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=False)
    arrays = {
        "input": keras.ops.convert_to_numpy(model.get_layer("embed")(ids)),  # the attention's input
        "query_kernel": attention._query_dense.kernel.numpy(),
        "query_bias": attention._query_dense.bias.numpy(),
        "key_kernel": attention._key_dense.kernel.numpy(),
        "key_bias": attention._key_dense.bias.numpy(),
    }
    probe = kgrad.GradientProbe(None, every_n_steps=1, capture=["weight_gradients"], histograms=False,
                                instruments=["attention"], attention_examples=2)
    model.fit(ids, np.ones((8, 1)), batch_size=8, shuffle=False, verbose=0, callbacks=[probe])
    for tag, value in probe.latest.scalars.items():
        if tag.startswith("attention_"):
            arrays[f"scalar/{tag}"] = np.asarray(value)
    np.savez(out_path, **arrays)
    print(f"done: {strategy.num_replicas_in_sync} replicas", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
