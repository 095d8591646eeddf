"""`kgrad.replay_step`: replays a bad step on the backend Keras runs on, and reports where its NaN was born.

Backend-free: each backend provides ``replay_fields`` (its replay, described for
`kgrad.backends.common.locate`); the report is built here, once.
"""

from kgrad.backends.common.batch_dump import join_notes
from kgrad.report.non_finite import report_of_birth


def replay_step(model, batch, step=None):
    """Replays a bad step (e.g. from a `kgrad.NonFiniteGuard` dump) and says where its NaN was born.

    Args:
        model: The model at the weights before the bad update.
        batch: The step's data ``(x, y[, sample_weight])``, or the dict of a
            dumped ``.npz`` (``dict(np.load(path))``).
        step: The step, for the report.

    Returns:
        A `kgrad.NonFiniteReport`, or ``None`` when the replay is finite.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> model = keras.Sequential([keras.Input((2,)),
    ...     keras.layers.Lambda(lambda t: keras.ops.log(t), name="log"),
    ...     keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> report = kgrad.replay_step(model, (np.array([[1.0, 0.0]]), np.ones((1, 1))), step=7)
    >>> report.born_in, report.born_at, report.step
    ('forward', 'log', 7)
    """
    from kgrad import backends

    born, note = backends.current().replay_fields(model, batch)
    if born is None:
        return None
    return report_of_birth({**born, "replay_note": join_notes(born.get("replay_note"), note)}, step)
