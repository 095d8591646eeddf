"""``kgrad demo``: vanishing gradients, seen from inside two deep MLPs.

Two 8-hidden-layer MLPs learn the same task, made locally (is a 2-D point
inside a circle?), with the same optimizer (SGD with momentum, which, unlike
Adam, does not rescale small gradients): one with sigmoid activations, one
with ReLU and He initialization. The sigmoid net's gradients shrink by about
4.6x per layer on their way back (‖dJ/dw‖ from ``output`` down to ``hidden_1``,
geometric mean), so its first layers barely move and it stays
at chance; the ReLU net learns. Each model writes Keras' TensorBoard logs and
kgrad's into its own folder, so TensorBoard shows them side by side.
"""

import os
import shlex
import sys
import time

import keras
import numpy as np

from kgrad.callbacks.gradient_probe import GradientProbe
from kgrad.demo_folders import RUNS, check_writable, prepare_log_dir  # noqa: F401 (part of this module's API)

#: The demo's models: run folder -> (hidden activation, kernel initializer).
MODELS = {
    "sigmoid_deep": ("sigmoid", "glorot_uniform"),
    "relu_deep": ("relu", "he_normal"),
}
HIDDEN_LAYERS = 8
WIDTH = 32


def make_circle_data(samples, seed=0):
    """Points of a 2-D standard normal, labelled 1 inside the median circle.

    Returns:
        ``(x, y)``: float32 arrays ``[samples, 2]`` and ``[samples, 1]``,
        about half of the labels 1.

    Example:

    >>> from kgrad.demo import make_circle_data
    >>> x, y = make_circle_data(1000)
    >>> x.shape, y.shape, 0.4 < float(y.mean()) < 0.6
    ((1000, 2), (1000, 1), True)
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, 2)).astype("float32")
    # The median of |x|^2 for a 2-D standard normal is 2 ln 2: balanced classes.
    inside = np.sum(np.square(x), axis=1) < 2.0 * np.log(2.0)
    return x, inside.astype("float32")[:, None]


def build_mlp(activation, initializer):
    """A compiled deep MLP: `HIDDEN_LAYERS` x `WIDTH` units, a sigmoid output.

    Both demo models share the name ``"mlp"``: weight tags contain the
    model's name (``weight_grad_norm/mlp/hidden_1/kernel``), and equal tags
    put both runs on the same TensorBoard chart.
    """
    layers = [keras.Input((2,))]
    for index in range(1, HIDDEN_LAYERS + 1):
        layers.append(
            keras.layers.Dense(
                WIDTH, activation=activation, kernel_initializer=initializer, name=f"hidden_{index}"
            )
        )
    layers.append(keras.layers.Dense(1, activation="sigmoid", name="output"))
    model = keras.Sequential(layers, name="mlp")
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    return model


class _Progress(keras.callbacks.Callback):
    """One line per epoch: loss, accuracy, and the first and last layers' dJ/dw."""

    def __init__(self, probe, epochs, out, interrupted=None):
        super().__init__()
        self._probe, self._epochs, self._out = probe, epochs, out
        self._interrupted = interrupted

    def on_train_batch_end(self, batch, logs=None):
        # Ctrl-C whose KeyboardInterrupt a library swallowed (one raised in a
        # `__del__` is only printed) still ends the demo, at the next batch.
        if self._interrupted is not None and self._interrupted.is_set():
            raise KeyboardInterrupt

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        record = self._probe.latest
        norms = ""
        if record is not None:
            first = _kernel_gradient_norm(record, "hidden_1")
            last = _kernel_gradient_norm(record, "output")
            norms = f"  weight grad (dJ/dw) hidden_1 {first:.1e}  output {last:.1e}"
        self._out.write(
            f"  epoch {epoch + 1:2d}/{self._epochs}  loss {logs.get('loss', float('nan')):.3f}"
            f"  accuracy {logs.get('accuracy', float('nan')):.2f}{norms}\n"
        )
        self._out.flush()


def _kernel_gradient_norm(record, layer):
    suffix = f"/{layer}/kernel"
    return next(
        (
            value
            for tag, value in record.scalars.items()
            if tag.startswith("weight_grad_norm/") and tag.endswith(suffix)
        ),
        float("nan"),
    )


def run_demo(log_dir, epochs=10, samples=4096, every_n_steps=10, overwrite=False, out=None, interrupted=None):
    """Trains the demo's models and writes their TensorBoard logs.

    Args:
        log_dir: Folder for the logs; each model writes ``<log_dir>/<run>``
            with Keras' ``train/`` and ``validation/`` and kgrad's ``kgrad/``.
        epochs: Epochs per model.
        samples: Samples of the made-up data set (20% held out).
        every_n_steps: Probe one training step in this many.
        overwrite: Replace earlier demo logs in ``log_dir``.
        out: Where progress goes (a text stream); default ``sys.stdout``.
        interrupted: A ``threading.Event`` set by Ctrl-C (``kgrad demo``'s), or
            ``None``: training stops at the next batch once it is set.

    Returns:
        ``dict`` run name -> final training accuracy.

    Example:

    >>> import tempfile, io
    >>> from kgrad.demo import run_demo
    >>> accuracy = run_demo(tempfile.mkdtemp(), epochs=1, samples=256, out=io.StringIO())
    >>> sorted(accuracy)
    ['relu_deep', 'sigmoid_deep']
    """
    out = sys.stdout if out is None else out
    prepare_log_dir(log_dir, overwrite)
    x, y = make_circle_data(samples)
    accuracy = {}
    for index, (run, (activation, initializer)) in enumerate(MODELS.items(), start=1):
        keras.utils.set_random_seed(index)
        out.write(
            f"[{index}/{len(MODELS)}] {run}: {HIDDEN_LAYERS} hidden {activation} layers "
            f"of {WIDTH} units, {initializer} init, SGD(momentum=0.9)\n"
        )
        run_dir = os.path.join(log_dir, run)
        model = build_mlp(activation, initializer)
        probe = GradientProbe(run_dir, every_n_steps=every_n_steps)
        callbacks = [probe, keras.callbacks.TensorBoard(run_dir), _Progress(probe, epochs, out, interrupted)]
        history = model.fit(
            x, y, batch_size=32, epochs=epochs, validation_split=0.2, callbacks=callbacks, verbose=0
        )
        accuracy[run] = history.history["accuracy"][-1]
    return accuracy


def main(log_dir, epochs=10, overwrite=False, out=None, interrupted=None):
    """What ``kgrad demo`` runs: the demo, then how to look at its logs."""
    out = sys.stdout if out is None else out
    prepare_log_dir(log_dir, overwrite)  # before anything is printed or trained
    out.write(
        "kgrad demo: two deep MLPs learn whether a 2-D point lies inside a circle.\n"
        "Watch |dJ/dw| of hidden_1, the layer farthest from the loss.\n\n"
    )
    start = time.monotonic()
    accuracy = run_demo(log_dir, epochs=epochs, overwrite=False, out=out, interrupted=interrupted)
    results = ", ".join(f"{run} {value:.2f}" for run, value in accuracy.items())
    quoted = shlex.quote(os.fspath(log_dir))
    out.write(
        f"\nDone in {time.monotonic() - start:.0f} s. Final training accuracy: {results}.\n"
        f"Logs: {log_dir}\n\n"
        "See the gradients of every layer in TensorBoard:\n"
        f"  tensorboard --logdir {quoted}\n"
        "  then open http://localhost:6006/#kgrad (its kgrad tab): every layer in forward order on\n"
        "  one log scale, where sigmoid_deep's first layers sit far below relu_deep's. Custom\n"
        "  Scalars charts up to 8 layers each; Histograms shows the gradients' distributions.\n\n"
        "Check gradient health from the command line (exits 1 when a layer is flagged):\n"
        f"  kgrad report {quoted}\n"
    )
