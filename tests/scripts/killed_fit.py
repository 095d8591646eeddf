"""Trains "forever" with a GradientProbe, saying on stdout when its events are flushed.

Run as ``python killed_fit.py LOG_DIR``; the test reads the lines below and
kills the process with SIGKILL in the middle of an epoch:

- ``flushed N`` after the probe flushed the events of the first N steps
  (the probe flushes at the end of each epoch, before this script's
  callback runs, as it comes first in ``callbacks``);
- ``mid-epoch`` in the middle of each epoch.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402

STEPS_PER_EPOCH = 40


class Progress(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == STEPS_PER_EPOCH // 2:
            print("mid-epoch", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        print(f"flushed {(epoch + 1) * STEPS_PER_EPOCH}", flush=True)


def main(log_dir):
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, activation="tanh", name="hidden"),
            keras.layers.Dense(1, name="out"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=False)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS_PER_EPOCH, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    probe = kgrad.GradientProbe(log_dir, every_n_steps=1, bucket_count=5)
    model.fit(x, y, batch_size=1, epochs=10**6, verbose=0, callbacks=[probe, Progress()])


if __name__ == "__main__":
    main(sys.argv[1])
