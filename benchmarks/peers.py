"""What users do today to see gradients, implemented as they are recommended.

Two peers, both written to TensorBoard so their cost includes what kgrad's
does (computing, crossing to the host, writing event files):

* `tensorboard_peer`: Keras' own ``TensorBoard(histogram_freq=1)``. It logs
  histograms of the **weights** (not of gradients) once per epoch.
* `ExtraPassGradientHistograms`: the callback that answers to TensorFlow
  issues recommend (e.g. tensorflow/tensorflow#31542, "Plotting gradients to
  TensorBoard"): a second ``tf.GradientTape`` forward and backward pass,
  eager, on a fixed batch, then ``tf.summary.histogram`` of every weight
  gradient and a ``flush``. The recipe runs it at epoch end; here it runs in
  ``on_train_batch_end`` every ``every_n_steps`` steps, so it is compared with
  kgrad at the same N.
"""

import os

import keras
import tensorflow as tf


def tensorboard_peer(log_dir):
    """Keras' ``TensorBoard`` callback with weight histograms every epoch."""
    return keras.callbacks.TensorBoard(log_dir=log_dir, histogram_freq=1)


class ExtraPassGradientHistograms(keras.callbacks.Callback):
    """Weight-gradient histograms from a second forward/backward pass.

    Args:
        log_dir: TensorBoard log directory; events go to ``<log_dir>/train``.
        x_batch: The inputs of the fixed batch the gradients are computed on.
        y_batch: Its targets.
        every_n_steps: Log on the first step of ``fit`` and every N steps.
    """

    def __init__(self, log_dir, x_batch, y_batch, every_n_steps):
        super().__init__()
        self.log_dir = log_dir
        self.x_batch = x_batch
        self.y_batch = y_batch
        self.every_n_steps = every_n_steps
        self._writer = None
        self._steps_seen = 0

    def on_train_begin(self, logs=None):
        self._steps_seen = 0
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "train"))

    def on_train_batch_end(self, batch, logs=None):
        # Steps are counted on the host: reading optimizer.iterations every
        # batch would add a device sync the recipe does not have.
        probe_now = self._steps_seen % self.every_n_steps == 0
        self._steps_seen += 1
        if probe_now:
            self._log_gradients()

    def _log_gradients(self):
        model = self.model
        step = model.optimizer.iterations
        with self._writer.as_default(), tf.GradientTape() as tape:
            y_pred = model(self.x_batch)  # forward pass, as in the recipe
            loss = model.loss(self.y_batch, y_pred)
            gradients = tape.gradient(loss, model.trainable_weights)
            # Eager gradients have no names; take them from the weights.
            for weight, gradient in zip(model.trainable_weights, gradients):
                tf.summary.histogram(weight.path.replace(":", "_") + "_grads", gradient, step=step)
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
