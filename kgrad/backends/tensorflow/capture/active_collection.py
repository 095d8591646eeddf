"""Which `TapeCollection` the ProbeTapes of this thread report to while a model's own ``train_step`` runs.

A registry of one value per thread, apart from the collections themselves so
that a `kgrad.ProbeTape` can find its collection without importing the
step that runs it.
"""

import threading

_LOCAL = threading.local()


def active_collection():
    """The collection of the ``train_step`` being traced (or replayed) in this thread, or ``None``."""
    return getattr(_LOCAL, "collection", None)


def set_active_collection(collection):
    """Makes ``collection`` (or ``None``) the one the ProbeTapes of this thread report to."""
    if collection is not None and active_collection() is not None:
        raise RuntimeError("kgrad: a probed train_step ran inside another one.")
    _LOCAL.collection = collection


def unique_name(counts, name):
    """``name``, or ``name#2``, ``name#3``... when ``counts`` (updated) saw it before."""
    counts[name] = counts.get(name, 0) + 1
    return name if counts[name] == 1 else f"{name}#{counts[name]}"
