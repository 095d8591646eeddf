"""A step's batch, kept for the guard's replay: unpacked, dumped to ``.npz``, loaded back.

Backend-free (NumPy and Keras' own data helpers): every backend's guard keeps
the batch of the step that trips it and replays it from these files.
"""

import os
import re

import numpy as np

from kgrad.backends.common import keras_internals

#: Key of the step's batch in the outputs of a guarded train step;
#: the backend's probing step keeps it for the replay.
BATCH_OUTPUT = "_kgrad_guard_batch"


def _named_leaves(prefix, structure):
    """``{"x": a}``, ``{"x[0]": a, ...}`` or ``{"x.key": a, ...}``: an ``.npz``'s keys."""
    if structure is None:
        return {}
    if isinstance(structure, dict):
        return {f"{prefix}.{key}": np.asarray(value) for key, value in structure.items()}
    if isinstance(structure, (list, tuple)):
        return {f"{prefix}[{index}]": np.asarray(value) for index, value in enumerate(structure)}
    return {prefix: np.asarray(structure)}


def _from_named(prefix, arrays):
    if prefix in arrays:
        return arrays[prefix]
    listed = sorted((int(key[len(prefix) + 1:-1]), key) for key in arrays if key.startswith(f"{prefix}["))
    if listed:
        # A tuple, as Keras passes a step its inputs (`pack_x_y_sample_weight`
        # would take a list of inputs for ``(x, y)``).
        return tuple(arrays[key] for _, key in listed)
    keyed = {key[len(prefix) + 1:]: arrays[key] for key in arrays if key.startswith(f"{prefix}.")}
    return keyed or None


def is_dump(batch):
    """Whether ``batch`` is the dict of a dumped ``.npz`` (keys ``x``, ``x[0]``, ``x.name``...)."""
    return isinstance(batch, dict) and any(key == "x" or key.startswith(("x[", "x.")) for key in batch)


def unpack_batch(batch):
    """``(x, y, sample_weight)`` of a step's data, or of a dict loaded from a dumped ``.npz``.

    Example:

    >>> import numpy as np
    >>> x, y, sample_weight = unpack_batch({"x[0]": np.ones(2), "x[1]": np.zeros(2), "y": np.ones(2)})
    >>> type(x).__name__, len(x), y.shape, sample_weight
    ('tuple', 2, (2,), None)
    """
    if is_dump(batch):
        arrays = dict(batch)
        return tuple(_from_named(prefix, arrays) for prefix in ("x", "y", "sample_weight"))
    import keras

    return keras.utils.unpack_x_y_sample_weight(batch)


def join_notes(*notes):
    """The notes that are not ``None``, in one string (or ``None``)."""
    return " ".join(note for note in notes if note) or None


def dump(model, batch, directory, step):
    """Writes ``step_<step>.npz`` (the batch) and ``step_<step>.keras`` (the model) into ``directory``.

    Returns:
        ``(lines, note)``: the three lines of Python that replay the step
        from them, and (sentences) why the batch or the model could not be
        written or the model rebuilt from its file; then ``lines`` is ``None``:
        no code is printed that would not run as printed.
    """
    stem = os.path.join(directory, f"step_{step}")
    try:
        os.makedirs(directory, exist_ok=True)
        x, y, sample_weight = unpack_batch(batch)
        arrays = {
            **_named_leaves("x", x), **_named_leaves("y", y),
            **_named_leaves("sample_weight", sample_weight),
        }
        np.savez(f"{stem}.npz", **arrays)
    except Exception as error:  # noqa: BLE001 - a failed dump must not hide the report
        why = f"{type(error).__name__}: {error}"
        return None, f"Not dumped: the batch could not be written to {stem}.npz ({why})."
    try:
        model.save(f"{stem}.keras")
    except Exception as error:  # noqa: BLE001 - the batch is still worth keeping
        why = f"{type(error).__name__}: {error}"
        return None, f"Not dumped: the model could not be saved to {stem}.keras ({why})."
    problem = _rebuild_problem(model, f"{stem}.keras", x)
    if problem is not None:
        return None, problem
    lines = (
        "import keras, numpy as np, kgrad\n"
        f"model = keras.saving.load_model({stem + '.keras'!r}, safe_mode=False)\n"
        f"print(kgrad.replay_step(model, dict(np.load({stem + '.npz'!r})), step={step}))"
    )
    return lines, None


def _rebuild_problem(model, path, x):
    """Why the model saved at ``path`` cannot be rebuilt and run on ``x``, with what to do; else ``None``.

    Keras saves an inline ``lambda`` of a ``Lambda`` layer as bytecode without
    the module names it uses (``keras``, ``np``): loading works, calling it
    raises ``NameError``. The replay's lines must run as printed, so the dump
    is tried once here, on a trip only.
    """
    import keras

    try:
        rebuilt = keras.saving.load_model(path, safe_mode=False)
        rebuilt(x, training=False)
        return None
    except Exception as error:  # noqa: BLE001 - said in the report, the batch is kept
        reason = _first_cause(error)
    inline = [
        layer.name for layer in keras_internals.flatten_layers(model, include_self=False)
        if isinstance(layer, keras.layers.Lambda) and getattr(layer.function, "__name__", "") == "<lambda>"
    ]
    if inline:
        return (
            f"The batch and the model are in {os.path.dirname(path) or '.'}, but the model cannot be "
            f"rebuilt from {path} ({reason}): Lambda layer {', '.join(repr(name) for name in inline)} "
            "holds an inline `lambda`, which Keras saves without the names it uses. To replay from "
            "the files, give that Lambda a function defined with `def` and decorated with "
            "@keras.saving.register_keras_serializable(), and import it before loading; in the "
            "process that trained, kgrad.replay_step(model, batch) replays the step."
        )
    return (
        f"The batch and the model are in {os.path.dirname(path) or '.'}, but the model cannot be "
        f"rebuilt from {path} ({reason}); in the process that trained, "
        "kgrad.replay_step(model, batch) replays the step."
    )


def _first_cause(error):
    """``"NameError: name 'keras' is not defined"``: the error's own line, not Keras' wrapper line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # Keras' bold names in terminals
    for line in text.splitlines():
        if "is not defined" in line:
            return f"{type(error).__name__}: {line.strip()}"
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}".strip().rstrip(":")
