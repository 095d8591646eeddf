"""Creating Keras' lazily built variables before a train step is traced.

Without a distribution strategy Keras creates the optimizer's variables, and
those of the compiled metrics and loss, inside the first trace of the train
step. A ``tf.function`` that creates variables while it traces traces itself
a second time and keeps both graphs for the life of the function: twice the
tracing time of the first step, and a second copy of the run's largest graph
held in memory. Keras' own step pays this too; a probing step's graph is
larger, and building first took the benchmark MobileNet's peak memory from
1.18x plain ``fit``'s to 1.05x with a probe on every step, and from 1.11x to
0.99x with the non-finite guard (`benchmarks/RESULTS.md`).

Keras itself builds all of them before tracing when a distribution strategy
is set (``Model._symbolic_build``: the model, loss and metrics run once on
symbolic inputs shaped like the data). This does the same for models whose
call is a graph of layers that has already run on symbolic inputs
(``keras.Model(inputs, outputs)``, ``keras.Sequential`` with an input shape).
Other models are left to Keras: their ``call`` may create weights, or do
things a symbolic call cannot.
"""

import keras

from kgrad.backends.tensorflow import keras_internals


def build_before_tracing(model, iterator):
    """Builds what the first trace of ``model``'s train step would build.

    Call it eagerly, just before the train function is first called on
    ``iterator``. The variables are those the trace would create, with the
    same initial values, so training is unchanged; nothing is done when they
    exist already or when ``model`` is not a graph of layers.

    Args:
        model: A compiled ``keras.Model``.
        iterator: What the train function is called with (its
            ``element_spec`` describes one batch).

    Example:

    >>> import keras, tensorflow as tf
    >>> from kgrad.backends.tensorflow.differentiate.prebuild import build_before_tracing
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> model.compile("adam", "mse", metrics=["mae"])
    >>> data = tf.data.Dataset.from_tensors((tf.ones((4, 3)), tf.ones((4, 2))))
    >>> build_before_tracing(model, iter(data))
    >>> model.optimizer.built
    True
    """
    spec = getattr(iterator, "element_spec", None)
    if spec is None or not _is_graph_of_layers(model) or not keras_internals.builds_symbolically(model):
        return
    try:
        # In the strategy's scope, as Keras does: variables made outside it
        # would not be mirrored.
        with model.distribute_strategy.scope():
            keras_internals.symbolic_build(model, spec)
    except Exception:
        # A metric or loss that cannot run on symbolic inputs (Keras would
        # raise this under a distribution strategy) may still run in the
        # trace: what is not built yet is built there, as without kgrad,
        # at the cost of the second trace only.
        pass


def _is_graph_of_layers(model):
    if isinstance(model, keras_internals.Functional):
        return True
    # A Sequential model given an input shape runs a Functional of its layers.
    return isinstance(model, keras.Sequential) and keras_internals.runs_a_functional(model)


class BuiltBeforeTracing:
    """A train function that calls `build_before_tracing` before its first call.

    Args:
        model: The model the function trains.
        function: The train function Keras made (``model.train_function``).
    """

    def __init__(self, model, function):
        self._model = model
        self._function = function
        self._built = False

    def __call__(self, iterator):
        if not self._built:
            build_before_tracing(self._model, iterator)
            self._built = True
        return self._function(iterator)
