"""What kgrad attaches to a user's model or optimizer: one registry, every entry named here.

Backend-free. Every piece of state kgrad keeps on an object it does not own
(the installation of a fit, the functions kept for the next fit, a
`kgrad.ProbingModel`'s options) is an entry of `KEYS`, held in one attribute
of that object, so that a reader finds all of it here and a new entry is one
line. The entries live on the object itself, not in a module-level
``WeakKeyDictionary``: they often refer back to it (a step holds its model),
and such a value would keep its key alive forever. The attribute is written
into the instance's ``__dict__``, past Keras' attribute tracking: kgrad's
state must stay out of the model's weights and out of saved models.

>>> import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> put(model, "installation", "the fit's installation")
>>> names(model), len(model.weights)  # not tracked by Keras
(['installation'], 2)
>>> pop(model, "installation"), get(model, "installation"), ATTRIBUTE in vars(model)
("the fit's installation", None, False)
"""

import threading

#: Every entry kgrad attaches, and what it holds.
KEYS = {
    "installation": "the kgrad callbacks' installation for the current fit (its probing step and "
                    "train function), removed at the fit's end",
    "kept_step": "the probing step and Keras' train function a finished fit leaves for the next one "
                 "(TensorFlow: valid while Keras keeps that train function)",
    "kept_train_functions": "the train functions of earlier fits, reused by a later fit of the same "
                            "options (JAX: tracing and compiling them again is the cost avoided)",
    "probe_config": "the options `kgrad.ProbingModel.configure_probe` set",
    "probing_step": "a `kgrad.ProbingModel`'s own probing step",
    "probing_function": "a `kgrad.ProbingModel`'s function traced for its options (JAX)",
    "latest_record": "a `kgrad.ProbingModel`'s latest record, read once (JAX)",
    "installed_guard": "the `kgrad.NonFiniteGuard`'s run of the current fit (JAX), removed at its end",
    "kept_guard_runs": "the guard's runs of earlier fits, reused by a later fit of the same options (JAX)",
}

#: The one attribute of an owner that holds its entries (absent when it has none).
ATTRIBUTE = "_kgrad"

# put and pop may run in parallel threads (replicas trace in parallel): one at a time,
# so that an entry put while the last one is popped is not lost with the attribute.
_LOCK = threading.Lock()


def _checked(key):
    if key not in KEYS:
        raise KeyError(f"{key!r} is not an entry of kgrad.backends.common.attached.KEYS: add it there "
                       f"with what it holds. Known: {', '.join(sorted(KEYS))}.")
    return key


def get(owner, key, default=None):
    """The entry ``key`` of ``owner``, or ``default`` if it has none."""
    return vars(owner).get(ATTRIBUTE, {}).get(_checked(key), default)


def names(owner):
    """The names of ``owner``'s entries, sorted."""
    return sorted(vars(owner).get(ATTRIBUTE, {}))


def put(owner, key, value):
    """Sets the entry ``key`` of ``owner`` to ``value``."""
    with _LOCK:
        # Straight into the instance's __dict__: Keras does not track it.
        vars(owner).setdefault(ATTRIBUTE, {})[_checked(key)] = value


def setdefault(owner, key, default):
    """The entry ``key`` of ``owner``, set to ``default`` first if it has none."""
    with _LOCK:
        return vars(owner).setdefault(ATTRIBUTE, {}).setdefault(_checked(key), default)


def pop(owner, key, default=None):
    """Removes the entry ``key`` of ``owner`` and returns it (``default`` if it had none)."""
    with _LOCK:
        entries = vars(owner).get(ATTRIBUTE, {})
        value = entries.pop(_checked(key), default)
        if not entries:
            vars(owner).pop(ATTRIBUTE, None)  # nothing of kgrad's is left on the object
        return value
