"""dJ/d(output of one layer or operation) of a functional model.

The question: in a functional model built from ``keras.ops.sin(t)``,
``keras.ops.cos(t)`` and their sum, how to get the gradient of the loss with
respect to the output of one layer? ``tape.watch(model.layers[1].output)``
fails: ``.output`` is a symbolic KerasTensor of the model's graph, not the
tensor computed on this batch. `kgrad.ProbeTape` intercepts the real
outputs — of layers and of the ``sin`` / ``cos`` / ``add`` operations, by the
names of ``model.operations`` — and returns dJ/d(output) for each.

Run: python examples/layer_gradient.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kgrad  # noqa: E402


def build_model():
    inputs = keras.Input((3,))
    t = keras.layers.Dense(4, name="dense")(inputs)
    total = keras.ops.add(keras.ops.sin(t), keras.ops.cos(t))
    outputs = keras.layers.Dense(1, name="head")(total)
    return keras.Model(inputs, outputs)


def main():
    keras.utils.set_random_seed(0)
    model = build_model()
    print("operations:", [operation.name for operation in model.operations])
    x = tf.random.normal((2, 3))
    y = tf.ones((2, 1))
    loss_fn = keras.losses.MeanSquaredError()

    # 1. What fails.
    try:
        with tf.GradientTape() as tape:
            tape.watch(model.layers[1].output)
    except Exception as error:  # noqa: BLE001 - shown to the reader
        first_line = str(error).strip().splitlines()[0][:90]
        print(f"tape.watch(model.layers[1].output) fails: {type(error).__name__}: {first_line}")

    # 2. The answer.
    with kgrad.ProbeTape(model, layers=["dense", "sin", "cos", "add"]) as tape:
        prediction = model(x)
        loss = loss_fn(y, prediction)
    weight_gradients = tape.gradient(loss, model.trainable_variables)
    gradients = tape.probe.gradients
    np.set_printoptions(precision=4, suppress=True)
    for name in ("sin", "dense"):
        print(f"dJ/d({name} output) =")
        print(gradients[name].numpy())
    print("weight gradient norms:", [round(float(tf.norm(g)), 4) for g in weight_gradients])

    # 3. Check by the chain rule: J = mean((head(sin t + cos t) - y)^2).
    dloss_dpred = 2.0 * (prediction - y) / tf.cast(tf.size(y), tf.float32)
    dloss_dadd = dloss_dpred @ tf.transpose(model.get_layer("head").kernel)
    t = tape.probe.activations["dense"]
    dloss_dt = dloss_dadd * (tf.cos(t) - tf.sin(t))
    errors = {
        "sin": gradients["sin"] - dloss_dadd,
        "cos": gradients["cos"] - dloss_dadd,
        "dense": gradients["dense"] - dloss_dt,
    }
    for name, error in errors.items():
        print(f"max |kgrad - chain rule| for {name}: {float(tf.reduce_max(tf.abs(error))):.2e}")


if __name__ == "__main__":
    main()
