"""A replay draws the random numbers its step drew: Keras seed generators, rewound.

A Keras random layer (``Dropout``, ``GaussianNoise``...) or a step that calls
``keras.random.*(seed=self.seed_generator)`` draws from a `SeedGenerator`:
each draw uses the generator's state, then adds ``[0, 1]`` to it. The step
that tripped the guard left its generators ``k`` draws further on. A replay
that ran from where they are now would draw other numbers (another Dropout
mask) and could miss the trip. `with_the_step_seeds` runs the replay once
to count the draws of one step, rewinds each generator by them, and runs it
again: the second pass draws exactly what the tripped step drew.

Random numbers that do not come from a model's seed generator (TensorFlow's
global ``tf.random.*``, ``keras.random.*`` without a seed) cannot be
rewound: a replay that does not reproduce the trip says so.
"""

from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.common.own_step import candidate_optimizers


def seed_generators(model):
    """The `keras.random.SeedGenerator`s of ``model``, its layers and nested models, each once."""
    found = {}
    for layer in keras_internals.flatten_layers(model):
        for generator in keras_internals.seed_generators(layer):
            found.setdefault(id(generator), generator)
    return list(found.values())


def replay_state_variables(model):
    """Every variable a replayed step may change: the model's, its metrics', its optimizers'."""
    variables = [*model.variables, *model.metrics_variables]
    for optimizer in candidate_optimizers(model):
        variables += optimizer.variables
    return list({id(variable): variable for variable in variables}.values())


class _Restoring:
    """Saves ``variables`` on entry, puts them back on exit (also on error) and on `restore`."""

    def __init__(self, variables):
        self._variables = variables
        self._saved = None

    def __enter__(self):
        self._saved = [variable.numpy() for variable in self._variables]
        return self

    def restore(self):
        for variable, value in zip(self._variables, self._saved):
            variable.assign(value)

    def __exit__(self, *exc_info):
        self.restore()


def with_the_step_seeds(model, run, seeds_after=None):
    """``run()`` with the model's seed generators where the tripped step found them.

    Every variable ``run`` changes is put back afterwards.

    Args:
        model: The model whose step is replayed.
        run: ``fn() -> result``: one eager replay of the step.
        seeds_after: The generators' states right after the tripped step, in
            `seed_generators` order (kept by the guard when later steps of the
            same execution drew on), or ``None`` when they are still there.

    Returns:
        ``(result, note)``: ``run()``'s result from the rewound generators,
        and ``None``, or why the generators could not be rewound.

    Example:

    >>> import keras, numpy as np
    >>> layer = keras.layers.Dropout(0.5, seed=3)
    >>> model = keras.Sequential([keras.Input((8,)), layer])
    >>> step = lambda: model(np.ones((1, 8)), training=True).numpy()
    >>> drawn = step()  # the tripped step drew this mask
    >>> replayed, note = with_the_step_seeds(model, step)
    >>> bool((replayed == drawn).all()), note
    (True, None)
    """
    generators = seed_generators(model)
    with _Restoring(replay_state_variables(model)) as saved:
        if seeds_after is not None:
            for generator, state in zip(generators, seeds_after):
                generator.state.assign(state)
        after = [generator.state.numpy() for generator in generators]
        result = run()  # the first pass counts each generator's draws
        drawn = [generator.state.numpy() - state for generator, state in zip(generators, after)]
        if not any(difference.any() for difference in drawn):
            return result, None
        if any(difference[0] or difference[1] < 0 for difference in drawn):
            return result, (
                "The model's seed generators were not advanced by ordered draws, so they could not "
                "be rewound: the replay's random numbers may differ from the step's."
            )
        saved.restore()
        for generator, state, difference in zip(generators, after, drawn):
            generator.state.assign(state - difference)
        result = run()
    if getattr(model, "jit_compile", False) and not getattr(model, "run_eagerly", False):
        # TensorFlow lets XLA pick its own algorithm for stateless random
        # numbers: the same seed gives other numbers than the eager kernels.
        return result, (
            "The step ran under XLA, whose random numbers (here from "
            f"{_layers_drawing(model, generators, drawn)}) differ from the eager replay's for the "
            "same seed: a value that depends on them may not be reproduced; fit with "
            "jit_compile=False to replay it exactly."
        )
    return result, None


def _layers_drawing(model, generators, drawn):
    """Names of the layers (or the model) whose generators drew, for a note."""
    owners = []
    for layer in keras_internals.flatten_layers(model):
        mine = {id(generator) for generator in keras_internals.seed_generators(layer)}
        if any(id(g) in mine and d.any() for g, d in zip(generators, drawn)):
            owners.append(repr(layer.name))
    return ", ".join(dict.fromkeys(owners)) or "the model's seed generators"
