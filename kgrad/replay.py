"""Replaying a tripped step eagerly, to name the operation where its first NaN/Inf was born.

The guard's every-step check (the loss and the weight gradients) says *that*
a step went non-finite, not *where*. A trip is rare and its step can be run
again: `replay` runs the step's own batch once more, eagerly, from the
weights before the bad update (the guard skipped it), with every layer,
nested layer, ``keras.ops`` node and `kgrad.tap` captured, forward and
backward. `locate` then names the first operation whose inputs are all
finite and whose output is not (forward order), or, when the forward pass is
finite, the first operation whose backward pass turns finite dJ/d(output)
into a non-finite dJ/d(input), from the loss down.
"""

import numpy as np

from kgrad.locate import in_weights, locate
from kgrad.loss_parts import loss_parts
from kgrad.replay_seeds import with_the_step_seeds

#: Key of the step's batch in the outputs of a guarded train step;
#: `kgrad.step.ProbingStep.take_outputs` keeps it for the replay.
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


def replay_fields(model, batch, seeds_after=None):
    """Runs one training step's forward and backward pass again, eagerly, and `locate`s its NaN.

    Nothing is applied: the weights stay as they are, and the state the
    replay changes (BatchNormalization statistics, seed generators, the
    compiled loss's trackers) is put back. A random layer draws what the
    tripped step drew (`kgrad.replay_seeds`). A model with its own
    ``train_step`` is replayed by `kgrad.own_step_replay`.

    Args:
        seeds_after: The model's seed-generator states right after the
            tripped step, if later steps drew on (see `with_the_step_seeds`).

    Returns:
        ``(born, note)``: the ``born_*`` fields of `locate` (``None`` if the
        replay was finite), and what may make the replay differ from the step.
    """
    from kgrad.custom_step import has_own_train_step

    if has_own_train_step(model):
        from kgrad.own_step_replay import replay_own_step

        return replay_own_step(model, batch, seeds_after)
    x, y, sample_weight = unpack_batch(batch)
    return with_the_step_seeds(model, lambda: _replay_once(model, x, y, sample_weight), seeds_after)


def _replay_once(model, x, y, sample_weight):
    from kgrad import forward
    from kgrad.tape import ProbeTape

    born = in_weights(model.weights)  # before the forward pass updates any statistic
    if born is not None:
        return born
    with ProbeTape(model, layers="all", watch_inputs=True, persistent=True,
                   record_inputs=True, _integer_inputs="skip") as tape:
        prediction = forward._forward(model, x)
        loss = model._compute_loss(
            x=x, y=y, y_pred=prediction, sample_weight=sample_weight, training=True
        )
    weights = model.trainable_weights
    gradients = tape.gradient(loss, weights)
    return locate(tape.probe, model, loss, y, sample_weight,
                  {weight.path: gradient for weight, gradient in zip(weights, gradients)},
                  check_weights=False,
                  loss_terms=lambda: loss_parts(model, y, prediction, sample_weight))


def join_notes(*notes):
    """The notes that are not ``None``, in one string (or ``None``)."""
    return " ".join(note for note in notes if note) or None


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

    >>> import keras, kgrad, numpy as np, tensorflow as tf
    >>> model = keras.Sequential([keras.Input((2,)),
    ...     keras.layers.Lambda(lambda t: tf.math.log(t), name="log"),
    ...     keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> report = kgrad.replay_step(model, (np.array([[1.0, 0.0]]), np.ones((1, 1))), step=7)
    >>> report.born_in, report.born_at, report.step
    ('forward', 'log', 7)
    """
    from kgrad.guard import NonFiniteReport

    born, note = replay_fields(model, batch)
    if born is None:
        return None
    kinds = {"forward": "activation", "backward": "grad", "data": "input", "weights": "weight"}
    kind = kinds[born["born_in"]]
    return NonFiniteReport(
        step=step, tensor=f"{kind}/{born['born_at']}", layer=born["born_at"], kind=kind,
        pass_="backward" if born["born_in"] == "backward" else "forward",
        nan_count=born["born_nan_count"], inf_count=born["born_inf_count"], last_finite_step=None,
        last_finite_norm=None, last_summaries={}, non_finite={}, replayed=True,
        **{**born, "replay_note": join_notes(born.get("replay_note"), note)},
    )


def dump(model, batch, directory, step):
    """Writes ``step_<step>.npz`` (the batch) and ``step_<step>.keras`` (the model) into ``directory``.

    Returns:
        ``(lines, note)``: the three lines of Python that replay the step
        from them, and why the model could not be saved (or ``None``).
    """
    import os

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
        return None, f"the batch could not be written to {stem}.npz ({type(error).__name__}: {error})"
    try:
        model.save(f"{stem}.keras")
    except Exception as error:  # noqa: BLE001 - the batch is still worth keeping
        return None, f"the model could not be saved to {stem}.keras ({type(error).__name__}: {error})"
    lines = (
        "import keras, numpy as np, kgrad\n"
        f"model = keras.saving.load_model({stem + '.keras'!r}, safe_mode=False)\n"
        f"print(kgrad.replay_step(model, dict(np.load({stem + '.npz'!r})), step={step}))"
    )
    return lines, None


def describe_birth(report):
    """The sentences of ``str(report)`` about the replay and the dump."""
    lines = []
    if report.born_in is not None:
        where = {"forward": "in the forward pass", "backward": "in the backward pass",
                 "data": "with the input data", "weights": "in the weights"}[report.born_in]
        verb = "arrived" if report.born_in == "data" else "was born"
        inside = f", at the kgrad.tap {report.born_inside!r} inside it" if report.born_inside else ""
        if report.born_tape is not None:
            inside += f", in the pass of ProbeTape {report.born_tape!r}"
        lines.append(
            f"Replayed: the first NaN/Inf {verb} {where} at {report.born_at!r} ({report.born_type}, "
            f"path {report.born_path!r}{inside}): {report.born_nan_count} NaN and "
            f"{report.born_inf_count} Inf."
        )
        if report.born_input_range is not None:
            low, high = report.born_input_range
            lines.append(f"Its finite input values ranged over [{low:.6g}, {high:.6g}].")
        if report.born_in == "weights" and report.born_step is not None:
            lines.append(f"The update of step {report.born_step} made it non-finite.")
        if report.batch_index is not None:
            lines.append(f"Batch {report.batch_index} of the epoch.")
    if report.replay_note:
        lines.append(report.replay_note)
    if report.reproduce:
        lines.append(f"To replay it:\n{report.reproduce}")
    return lines
