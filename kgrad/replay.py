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
import tensorflow as tf

from kgrad import taps
from kgrad.summaries import io_names

#: Key of the step's batch in the outputs of a guarded train step;
#: `kgrad.step.ProbingStep.take_outputs` keeps it for the replay.
BATCH_OUTPUT = "_kgrad_guard_batch"


def _float_arrays(structure):
    """The floating-point leaves of ``structure`` (tensors, variables, arrays) as arrays."""
    leaves = (np.asarray(leaf) for leaf in tf.nest.flatten(structure) if hasattr(leaf, "dtype"))
    return [values for values in leaves if values.dtype.kind == "f"]


def _counts(structure):
    """(nan, inf) over the float leaves of ``structure``."""
    nan = inf = 0
    for values in _float_arrays(structure):
        nan, inf = nan + int(np.isnan(values).sum()), inf + int(np.isinf(values).sum())
    return nan, inf


def _finite_range(structure):
    """(min, max) of the finite float values of ``structure``, or ``None`` if it has none."""
    finite = [values.astype(np.float64).ravel() for values in _float_arrays(structure)]
    finite = [values[np.isfinite(values)] for values in finite]
    finite = np.concatenate(finite) if finite else np.zeros([0])
    return (float(finite.min()), float(finite.max())) if finite.size else None


def _operations(model):
    """``fn(recorded name) -> (type, path)`` for the names a ProbeTape records."""
    if model is None:
        return lambda name: (None, None)
    named = taps.tappable_operations(model)
    paths = {}
    for path, operation in named.items():
        if len(path) >= len(paths.get(id(operation), "")):
            paths[id(operation)] = path

    def describe(name):
        base = name.split("#")[0]
        if base not in named and "/" in base:  # "name/0": a layer's first float output
            base = base.rsplit("/", 1)[0]
        operation = named.get(base)
        if operation is None:
            return "kgrad.tap", name  # only taps are recorded without being operations
        return type(operation).__name__, paths[id(operation)]

    return describe


def _birth(born_in, name, kind, path, counts, input_range, **extra):
    return {
        "born_in": born_in, "born_at": name, "born_type": kind, "born_path": path,
        "born_nan_count": counts[0], "born_inf_count": counts[1], "born_input_range": input_range,
        **extra,
    }


def _in_data(probe, targets, sample_weight):
    """A non-finite input, target or sample weight: the NaN arrived with the data."""
    parts = []
    if probe.input is not None:
        leaves = tf.nest.flatten(probe.input)
        names = io_names(probe.input, "input")
        parts += [(name if len(names) == 1 else f"input/{name}", leaf) for name, leaf in zip(names, leaves)]
    parts += [("target", targets), ("sample_weight", sample_weight)]
    for name, structure in parts:
        counts = _counts(structure) if structure is not None else (0, 0)
        if any(counts):
            return _birth("data", name, "input data", name, counts, _finite_range(structure))
    return None


def _in_forward(probe, describe, loss):
    """The first recorded operation whose inputs are finite and whose output is not."""
    taps_inside = []  # non-finite taps recorded before the layer that encloses them
    for name, tensor in probe.activations.items():
        counts = _counts(tensor)
        if not any(counts):
            continue
        kind, path = describe(name)
        if kind == "kgrad.tap":
            taps_inside.append((name, counts))
            continue
        inputs = probe.layer_inputs.get(name, probe.layer_inputs.get(name.split("/")[0]))
        if inputs is not None and any(_counts(inputs)):
            continue  # it only carries a value born in an operation the tape cannot see
        # Inputs unknown (no record_inputs): the first non-finite output is all we know.
        return _birth("forward", name, kind, path, counts, None if inputs is None else _finite_range(inputs),
                      born_inside=taps_inside[0][0] if taps_inside else None)
    if taps_inside:
        name, counts = taps_inside[0]
        return _birth("forward", name, "kgrad.tap", name, counts, None)
    if loss is not None and any(_counts(loss)):
        return _birth("forward", "loss", "loss", "loss", _counts(loss), _finite_range(probe.prediction))
    return None


def _consumer(probe, names, index):
    """The operation after ``names[index]`` that took its output as input (else the next one)."""
    produced = probe.activations[names[index]]
    later = [name for name in names[index + 1:] if name in probe.layer_inputs]
    for name in later:
        if any(leaf is produced for leaf in tf.nest.flatten(probe.layer_inputs[name])):
            return name
    return later[0] if later else None


def _in_backward(probe, describe):
    """The operation whose backward pass first turns finite dJ/d(output) into non-finite dJ/d(input)."""
    names = [name for name in probe.activations if probe.gradients.get(name) is not None]
    for index in reversed(range(len(names))):
        counts = _counts(probe.gradients[names[index]])
        if not any(counts):
            continue
        consumer = _consumer(probe, names, index)
        if consumer is None:  # dJ/dŷ itself: the loss's backward pass
            return _birth("backward", "loss", "loss", "loss", counts, _finite_range(probe.prediction))
        kind, path = describe(consumer)
        return _birth("backward", consumer, kind, path, counts, _finite_range(probe.layer_inputs[consumer]))
    if probe.input_gradient is not None and any(_counts(probe.input_gradient)) and names:
        kind, path = describe(names[0])
        counts = _counts(probe.input_gradient)
        return _birth("backward", names[0], kind, path, counts, _finite_range(probe.layer_inputs.get(names[0])))
    return None


def _in_weights(weights):
    for weight in weights or ():
        counts = _counts(weight)
        if any(counts):
            return _birth("weights", weight.path, "weight", weight.path, counts, _finite_range(weight))
    return None


def locate(probe, model=None, loss=None, targets=None, sample_weight=None, weight_gradients=None):
    """Where a probed step's first NaN/Inf was born, as `NonFiniteReport` fields.

    Checked in this order: the model's weights (made non-finite by an
    earlier update), the data (inputs, targets, sample weights), the forward
    pass (the first captured operation with finite inputs and a non-finite
    output; a `kgrad.tap` inside it is given as ``born_inside``), the loss,
    then the backward pass from the loss down.

    Args:
        probe: The `kgrad.ProbeResult` of a ``ProbeTape(record_inputs=True)``
            (without it, every operation's input is unknown and the first
            non-finite output is named).
        model: The probed model (names, types and paths of its operations;
            its weights are checked first).
        loss: The loss tensor, if it was computed.
        targets, sample_weight: The batch's targets and sample weights.
        weight_gradients: ``dict`` weight path -> gradient, checked last.

    Returns:
        A ``dict`` of ``born_*`` fields, or ``None`` if everything is finite.

    Example:

    >>> import keras, numpy as np, tensorflow as tf, kgrad
    >>> from kgrad.replay import locate
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="first"),
    ...     keras.layers.Lambda(keras.ops.log, name="log"), keras.layers.Dense(1, name="out")])
    >>> model.layers[0].set_weights([-np.eye(2, dtype="float32"), np.zeros(2, "float32")])
    >>> with kgrad.ProbeTape(model, layers="all", record_inputs=True) as tape:
    ...     loss = tf.reduce_sum(model(tf.ones((1, 2))))
    >>> _ = tape.gradient(loss, model.trainable_variables)
    >>> born = locate(tape.probe, model, loss)
    >>> born["born_in"], born["born_at"], born["born_type"], born["born_nan_count"]
    ('forward', 'log', 'Lambda', 2)
    """
    describe = _operations(model)
    found = (
        _in_weights(model.weights if model is not None else None)
        or _in_data(probe, targets, sample_weight)
        or _in_forward(probe, describe, loss)
        or _in_backward(probe, describe)
    )
    if found is None:
        for path, gradient in (weight_gradients or {}).items():
            if gradient is not None and any(_counts(gradient)):
                return _birth("backward", path, "weight gradient", path, _counts(gradient), None)
    return found


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
        return [arrays[key] for _, key in listed]
    keyed = {key[len(prefix) + 1:]: arrays[key] for key in arrays if key.startswith(f"{prefix}.")}
    return keyed or None


def unpack_batch(batch):
    """``(x, y, sample_weight)`` of a step's data, or of a dict loaded from a dumped ``.npz``.

    Example:

    >>> import numpy as np
    >>> x, y, sample_weight = unpack_batch({"x[0]": np.ones(2), "x[1]": np.zeros(2), "y": np.ones(2)})
    >>> len(x), y.shape, sample_weight
    (2, (2,), None)
    """
    if isinstance(batch, dict) and any(key == "x" or key.startswith(("x[", "x.")) for key in batch):
        arrays = dict(batch)
        return tuple(_from_named(prefix, arrays) for prefix in ("x", "y", "sample_weight"))
    import keras

    return keras.utils.unpack_x_y_sample_weight(batch)


def replay_fields(model, batch):
    """Runs one training step's forward and backward pass again, eagerly, and `locate`s its NaN.

    Nothing is applied: the weights stay as they are, and the non-trainable
    state the forward pass changes (BatchNormalization statistics, seeds)
    is put back.

    Returns:
        The ``born_*`` fields of `locate`, or ``None`` if the replay was finite.
    """
    from kgrad import forward
    from kgrad.tape import ProbeTape

    x, y, sample_weight = unpack_batch(batch)
    state = list(model.non_trainable_variables)
    saved = [variable.numpy() for variable in state]
    try:
        with ProbeTape(model, layers="all", watch_inputs=True, persistent=True,
                       record_inputs=True, _integer_inputs="skip") as tape:
            prediction = forward._forward(model, x)
            loss = model._compute_loss(x=x, y=y, y_pred=prediction, sample_weight=sample_weight, training=True)
        weights = model.trainable_weights
        gradients = tape.gradient(loss, weights)
    finally:
        for variable, value in zip(state, saved):
            variable.assign(value)
    return locate(tape.probe, model, loss, y, sample_weight,
                  {weight.path: gradient for weight, gradient in zip(weights, gradients)})


def replay(model, batch, step=None):
    """Replays a bad step (e.g. from a `kgrad.NonFiniteGuard` dump) and says where its NaN was born.

    Args:
        model: The model at the weights before the bad update.
        batch: The step's data ``(x, y[, sample_weight])``, or the dict of a
            dumped ``.npz`` (``dict(np.load(path))``).
        step: The step, for the report.

    Returns:
        A `kgrad.NonFiniteReport`, or ``None`` when the replay is finite.
    """
    from kgrad.guard import NonFiniteReport

    born = replay_fields(model, batch)
    if born is None:
        return None
    kind = {"forward": "activation", "backward": "grad", "data": "input", "weights": "weight"}[born["born_in"]]
    return NonFiniteReport(
        step=step, tensor=f"{kind}/{born['born_at']}", layer=born["born_at"], kind=kind,
        pass_="backward" if born["born_in"] == "backward" else "forward",
        nan_count=born["born_nan_count"], inf_count=born["born_inf_count"], last_finite_step=None,
        last_finite_norm=None, last_summaries={}, non_finite={}, replayed=True, **born,
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
        arrays = {**_named_leaves("x", x), **_named_leaves("y", y), **_named_leaves("sample_weight", sample_weight)}
        np.savez(f"{stem}.npz", **arrays)
    except Exception as error:  # noqa: BLE001 - a failed dump must not hide the report
        return None, f"the batch could not be written to {stem}.npz ({type(error).__name__}: {error})"
    try:
        model.save(f"{stem}.keras")
    except Exception as error:  # noqa: BLE001 - the batch is still worth keeping
        return None, f"the model could not be saved to {stem}.keras ({type(error).__name__}: {error})"
    lines = (
        "import keras, numpy as np, kgrad.replay\n"
        f"model = keras.saving.load_model({stem + '.keras'!r}, safe_mode=False)\n"
        f"print(kgrad.replay.replay(model, dict(np.load({stem + '.npz'!r})), step={step}))"
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
