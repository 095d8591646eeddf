"""dJ/d(input) of a functional MobileNet classifier, and gradient ascent on the image.

The question: how to get the gradient of the loss with respect to the input
of ``keras.applications.MobileNet(weights=None, include_top=False)`` + pooling
+ Dense, to change the input image so that the model is more confident of a
class. ``kgrad.ProbeTape(model, watch_inputs=True)`` watches the tensor the
model actually receives and returns dJ/dx in ``tape.probe.input_gradient``,
from the same backward pass as the weight gradients.

Run: python examples/input_gradient.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import kgrad  # noqa: E402

CLASSES = 5
TARGET_CLASS = 3


def build_model():
    backbone = keras.applications.MobileNet(
        weights=None, include_top=False, input_shape=(32, 32, 3), alpha=0.25
    )
    inputs = keras.Input((32, 32, 3))
    features = keras.layers.GlobalAveragePooling2D()(backbone(inputs, training=False))
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="classes")(features)
    return keras.Model(inputs, outputs)


def calibrate_batch_norm(model, images):
    """Sets BatchNorm statistics from one batch (an untrained net has none)."""
    # With the initial moving mean 0 / variance 1, an untrained MobileNet's
    # signal vanishes through its 27 layers and every output is uniform.
    backbone = model.layers[1]
    norms = [
        layer for layer in backbone.layers if isinstance(layer, keras.layers.BatchNormalization)
    ]
    for layer in norms:
        layer.momentum = 0.0
    model(images, training=True)
    for layer in norms:
        layer.momentum = 0.99


def input_gradient(model, image, loss_fn, target):
    """dJ/d(image) and the loss, through kgrad."""
    with kgrad.ProbeTape(model, layers=[], watch_inputs=True) as tape:
        probabilities = model(image, training=False)
        loss = loss_fn(target, probabilities)
    tape.gradient(loss, [])  # one backward pass; inputs are always included
    return tape.probe.input_gradient, loss, probabilities


def main():
    keras.utils.set_random_seed(0)
    model = build_model()
    calibrate_batch_norm(model, tf.random.uniform((16, 32, 32, 3)))
    loss_fn = keras.losses.CategoricalCrossentropy()
    target = tf.one_hot([TARGET_CLASS], CLASSES)
    image = tf.random.uniform((1, 32, 32, 3))

    gradient, _, _ = input_gradient(model, image, loss_fn, target)
    with tf.GradientTape() as plain:  # the reference: watch the input by hand
        plain.watch(image)
        reference = plain.gradient(loss_fn(target, model(image, training=False)), image)
    print(f"dJ/d(input): shape {tuple(gradient.shape)}, norm {float(tf.norm(gradient)):.4e}")
    error = float(tf.reduce_max(tf.abs(gradient - reference)))
    print(f"max |kgrad - tf.GradientTape.watch(input)| = {error:.2e}")

    # Gradient ascent on the class probability = descent on its cross-entropy.
    step_size = 0.02
    for step in range(6):
        gradient, loss, probabilities = input_gradient(model, image, loss_fn, target)
        print(
            f"step {step}: p(class {TARGET_CLASS})={float(probabilities[0, TARGET_CLASS]):.6f} "
            f"loss={float(loss):.6f} |dJ/dx|={float(tf.norm(gradient)):.3e}"
        )
        # A normalized step: MobileNet's raw input gradient is tiny at init.
        image = image - step_size * gradient / (tf.norm(gradient) + 1e-12)
    final = float(model(image, training=False)[0, TARGET_CLASS])
    print(f"final: p(class {TARGET_CLASS})={final:.6f}")


if __name__ == "__main__":
    main()
