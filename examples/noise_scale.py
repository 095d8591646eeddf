"""The gradient noise scale grows as training proceeds (the README's example).

Run: ``python examples/noise_scale.py [LOG_DIR]`` (7 s on 2 CPU cores), then
``kgrad report LOG_DIR`` for the critical batch size from the event files.
"""

import sys

import keras, numpy as np, kgrad  # noqa: E401

log_dir = sys.argv[1] if len(sys.argv) > 1 else "logs/noise"

keras.utils.set_random_seed(0)
x = np.random.normal(size=(4096, 2)).astype("float32")
y = (np.sum(x**2, axis=1) < 1.4).astype("int32")          # inside a circle?
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(True))
smoother = kgrad.NoiseScaleSmoother(decay=0.98)


def on_probe(record):                                      # every 2nd step, on the host
    s = record.scalars
    smoother.update(s["global/noise_example_sq_norm_mean"], s["global/noise_batch_sq_norm"],
                    s["global/batch_size"])
    if record.step % 128 == 0:
        if smoother.b_simple is None:  # its |G|² estimate is not positive (yet): no guess
            print(f"step {record.step}: B_simple not estimated yet")
        else:
            print(f"step {record.step}: B_simple {smoother.b_simple:.0f}, SNR {smoother.snr:.2f}")


probe = kgrad.GradientProbe(log_dir, every_n_steps=2, capture=["weight_gradients"],
                            histograms=False, instruments=["per_example"], on_probe=on_probe)
model.fit(x, y, batch_size=64, epochs=16, callbacks=[probe], verbose=0)
