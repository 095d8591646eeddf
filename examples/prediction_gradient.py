"""dJ/d(prediction) when `tape.gradient(loss, predictions)` returns None.

The question: a subclassed model ends in softmax and is trained with a custom
``train_step`` and ``CategoricalCrossentropy``; ``tape.gradient(loss,
predictions)`` is ``None``. Keras computed the loss from the logits kept on
the softmax output, so the predictions are not on the loss's path.
`kgrad.prediction_gradient` evaluates the same loss on a plain copy of the
predictions and returns dJ/dŷ, without changing the training loss.

Run: python examples/prediction_gradient.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kgrad  # noqa: E402


class Classifier(keras.Model):
    """A small classifier ending in softmax, with its own train_step."""

    def __init__(self, classes):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu", name="hidden")
        self.scores = keras.layers.Dense(classes, activation="softmax", name="scores")
        self.loss_fn = keras.losses.CategoricalCrossentropy()

    def call(self, x):
        return self.scores(self.hidden(x))

    def train_step(self, data):
        x, y = data
        # A ProbeTape is a tf.GradientTape that also records the layer outputs.
        with kgrad.ProbeTape(self) as tape:
            y_pred = self(x, training=True)
            loss = self.loss_fn(y, y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        dloss_dpred = kgrad.prediction_gradient(self.loss_fn, y, y_pred)
        return {
            "loss": loss,
            "pred_grad_norm": tf.norm(dloss_dpred),
            "hidden_grad_norm": tf.norm(tape.probe.gradients["hidden"]),
        }


def make_data(samples=64, features=8, classes=3):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, features)).astype("float32")
    labels = (x[:, 0] > 0).astype(int) + (x[:, 1] > 1).astype(int)
    return x, np.eye(classes, dtype="float32")[labels]


def main():
    keras.utils.set_random_seed(0)
    x, y = make_data()
    model = Classifier(classes=3)
    batch_x, batch_y = tf.constant(x[:4]), tf.constant(y[:4])

    # 1. The trap.
    with tf.GradientTape() as tape:
        y_pred = model(batch_x)
        tape.watch(y_pred)
        loss = model.loss_fn(batch_y, y_pred)
    print("tf.GradientTape: tape.gradient(loss, predictions) =", tape.gradient(loss, y_pred))

    # 2. The answer.
    dloss_dpred = kgrad.prediction_gradient(model.loss_fn, batch_y, y_pred)
    np.set_printoptions(precision=4, suppress=True)
    print("kgrad.prediction_gradient: dJ/d(predictions) =")
    print(dloss_dpred.numpy())
    # For Keras' cross-entropy (which normalizes p by its sum) averaged over a
    # batch of 4: dJ/dp = (1 - y / p) / 4.
    closed_form = (1.0 - batch_y / y_pred) / 4.0
    error = float(tf.reduce_max(tf.abs(dloss_dpred - closed_form)))
    print(f"max |kgrad - closed form (1 - y/p)/batch| = {error:.2e}")

    # 3. The same inside the custom train_step, during fit.
    model.compile(optimizer=keras.optimizers.Adam(0.05))
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    for epoch, (loss, pred_norm, hidden_norm) in enumerate(
        zip(*(history.history[k] for k in ("loss", "pred_grad_norm", "hidden_grad_norm"))), 1
    ):
        print(
            f"epoch {epoch}: loss={loss:.4f} |dJ/d(predictions)|={pred_norm:.4f} "
            f"|dJ/d(hidden)|={hidden_norm:.4f}"
        )


if __name__ == "__main__":
    main()
