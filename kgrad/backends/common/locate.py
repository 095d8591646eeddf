"""Where a replayed step's first NaN/Inf was born: the ordering rules, over a neutral account of its calls.

Backend-free and written once: each backend's replay runs the step again,
describes each call it recorded as a `Call` (NaN/Inf counts of its output,
of its inputs and of dJ/d(its output), in forward order) and the loss as a
`Loss`, and `locate` applies the rules. Checked in this order: the model's
weights (an earlier update made them non-finite), the data (inputs, targets,
sample weights), the forward pass (the first call whose inputs are all finite
and whose output is not; a `kgrad.tap` inside it is given as ``born_inside``),
the loss (its first non-finite term, when the backend can list them), the
backward pass from the loss down (the first call whose dJ/d(input) is
non-finite while dJ/d(output) is finite), then the weight gradients.

`counts` and `finite_range` read host arrays of every floating dtype,
bfloat16 included (NumPy gives it ``dtype.kind == "V"``). A backend that
counts on the devices (JAX, whose arrays may span several hosts) hands
`in_weights` and `in_data` a `Measured` in place of each array.

>>> import numpy as np
>>> calls = [Call("dense", "Dense", "dense", output=(0, 0), inputs=(0, 0), input_range=(0.0, 1.0)),
...          Call("log", "Lambda", "log", output=(2, 0), inputs=(0, 0), input_range=(-1.0, 0.5))]
>>> born = locate(calls, loss=Loss(counts(np.array([np.nan]))))
>>> born["born_in"], born["born_at"], born["born_nan_count"], born["born_input_range"]
('forward', 'log', 2, (-1.0, 0.5))
"""

import dataclasses

import numpy as np
from keras import tree

from kgrad.plan.tag_names import io_names

#: The `Call.kind` of a value marked with `kgrad.tap` (not an operation of the model).
TAP_KIND = "kgrad.tap"


@dataclasses.dataclass(frozen=True)
class Call:
    """One call the replay recorded, in forward order.

    Attributes:
        name: The recorded name (a layer, a ``keras.ops`` node, a `kgrad.tap`).
        kind: Its class name, or `TAP_KIND`.
        path: Its path in nested models.
        output: ``(nan, inf)`` of its output.
        inputs: ``(nan, inf)`` of its inputs, or ``None`` if they were not recorded.
        input_range: ``(min, max)`` of the finite values of its inputs, or ``None``.
        output_gradient: ``(nan, inf)`` of dJ/d(its output), or ``None`` if the
            backward pass did not reach it.
        takes: The names of the calls whose outputs it took as inputs
            (``"input"`` for the model's input), as far as the backend knows.
    """

    name: str
    kind: str
    path: str
    output: tuple
    inputs: tuple = None
    input_range: tuple = None
    output_gradient: tuple = None
    takes: tuple = ()


@dataclasses.dataclass(frozen=True)
class Loss:
    """The replayed loss.

    Attributes:
        counts: ``(nan, inf)`` of the loss.
        terms: ``fn() -> [Call]``, the terms the loss adds up (``output`` their
            counts), called only when the loss is the first non-finite value;
            ``None`` when the backend cannot split the loss.
        note: Said beside a birth in the loss (what the replay cannot split).
    """

    counts: tuple
    terms: object = None
    note: str = None


@dataclasses.dataclass(frozen=True)
class Measured:
    """A weight's or a data leaf's NaN/Inf counts and finite range, computed where its values live.

    Attributes:
        nan_inf: ``(nan, inf)``.
        finite_range: ``(min, max)`` of its finite values, or ``None``.
    """

    nan_inf: tuple
    finite_range: tuple = None


def _measures(values):
    """``((nan, inf), finite range)`` of ``values``: a `Measured`'s, or read from the host array."""
    if isinstance(values, Measured):
        return values.nan_inf, values.finite_range
    return counts(values), finite_range(values)


def float_arrays(structure):
    """The floating-point leaves of ``structure`` (tensors, variables, arrays) as host arrays.

    bfloat16 included, whose NumPy ``dtype.kind`` is ``"V"``.
    """
    leaves = (np.asarray(leaf) for leaf in tree.flatten(structure) if hasattr(leaf, "dtype"))
    return [values for values in leaves if values.dtype.kind == "f" or values.dtype.name == "bfloat16"]


def counts(structure):
    """``(nan, inf)`` over the floating-point leaves of ``structure``."""
    arrays = [values.astype(np.float64) for values in float_arrays(structure)]
    return (sum(int(np.isnan(values).sum()) for values in arrays),
            sum(int(np.isinf(values).sum()) for values in arrays))


def finite_range(structure):
    """``(min, max)`` of the finite floating-point values of ``structure``, or ``None`` if it has none."""
    finite = [values.astype(np.float64).ravel() for values in float_arrays(structure)]
    finite = np.concatenate([values[np.isfinite(values)] for values in finite]) if finite else np.zeros([0])
    return (float(finite.min()), float(finite.max())) if finite.size else None


def birth(born_in, name, kind, path, nan_inf, input_range, **extra):
    """The ``born_*`` fields of a `kgrad.NonFiniteReport`."""
    return {
        "born_in": born_in, "born_at": name, "born_type": kind, "born_path": path,
        "born_nan_count": int(nan_inf[0]), "born_inf_count": int(nan_inf[1]), "born_input_range": input_range,
        **extra,
    }


def in_weights(weights):
    """The first non-finite weight of ``[(path, values or Measured)]`` (an earlier update), or ``None``."""
    for path, values in weights:
        nan_inf, value_range = _measures(values)
        if any(nan_inf):
            return birth("weights", path, "weight", path, nan_inf, value_range)
    return None


def in_data(inputs, targets, sample_weight):
    """The first non-finite input, target or sample weight (the NaN arrived with the data), or ``None``.

    Each leaf of the three structures is an array or its `Measured`.
    """
    for structure, prefix in ((inputs, "input"), (targets, "target"), (sample_weight, "sample_weight")):
        if structure is None:
            continue
        names = io_names(structure, prefix)  # each input, and each output's target and weights
        for name, leaf in zip(names, tree.flatten(structure)):
            name = name if len(names) == 1 else f"{prefix}/{name}"
            nan_inf, value_range = _measures(leaf)
            if any(nan_inf):
                return birth("data", name, "input data", name, nan_inf, value_range)
    return None


def in_loss(loss, prediction_range=None):
    """The first non-finite term of a non-finite `Loss`, else the loss itself; ``None`` if it is finite.

    ``prediction_range``: ``(min, max)`` of the finite values of the prediction, or ``None``.
    """
    if loss is None or not any(loss.counts):
        return None
    for term in loss.terms() if loss.terms is not None else ():
        if any(term.output):
            return birth("forward", term.name, term.kind, term.path, term.output, term.input_range)
    extra = {} if loss.note is None else {"replay_note": loss.note}
    return birth("forward", "loss", "loss", "loss", loss.counts, prediction_range, **extra)


def in_forward(calls, loss=None, prediction_range=None, unseen_operation="the replay does not record"):
    """The first call whose inputs are finite and whose output is not; else the loss (`in_loss`), or ``None``.

    Args:
        unseen_operation: How the backend names an operation it does not
            record, for the note of a value already non-finite at a call's input.
    """
    taps_inside = []  # non-finite taps recorded before the layer that encloses them
    carried = None  # the first call with a non-finite input and output
    for call in calls:
        if not any(call.output):
            continue
        if call.kind == TAP_KIND:
            taps_inside.append(call)
        elif call.inputs is not None and any(call.inputs):
            carried = carried or call  # it only carries a value born before it
        else:  # inputs finite, or unknown: then the first non-finite output is all we know
            return birth("forward", call.name, call.kind, call.path, call.output, call.input_range,
                         born_inside=taps_inside[0].name if taps_inside else None)
    if taps_inside:
        tap = taps_inside[0]
        return birth("forward", tap.name, TAP_KIND, tap.name, tap.output, None)
    if carried is not None:
        note = (f"Its input was already non-finite: the value was born before {carried.name!r}, "
                f"in an operation {unseen_operation}.")
        return birth("forward", carried.name, carried.kind, carried.path, carried.output, carried.input_range,
                     replay_note=note)
    return in_loss(loss, prediction_range)


def in_backward(calls, prediction_range=None, input_gradient=(0, 0), weight_gradients=()):
    """The call whose backward pass first turns a finite dJ/d(output) into a non-finite dJ/d(input).

    Args:
        prediction_range: Of the prediction, for a birth in the loss's backward pass.
        input_gradient: ``(nan, inf)`` of dJ/d(the model's inputs).
        weight_gradients: ``[(path, (nan, inf))]``, checked last.
    """
    reached = [call for call in calls if call.output_gradient is not None]
    for index in reversed(range(len(reached))):
        nan_inf = reached[index].output_gradient
        if not any(nan_inf):
            continue
        # The call that took this output as input, else the next one whose inputs are known.
        later = [call for call in reached[index + 1:] if call.inputs is not None]
        consumer = next((call for call in later if reached[index].name in call.takes), None)
        consumer = consumer or (later[0] if later else None)
        if consumer is None:  # dJ/dŷ itself: the loss's backward pass
            return birth("backward", "loss", "loss", "loss", nan_inf, prediction_range)
        return birth("backward", consumer.name, consumer.kind, consumer.path, nan_inf, consumer.input_range)
    if any(input_gradient) and reached:
        consumer = next((call for call in reached if "input" in call.takes), reached[0])
        return birth("backward", consumer.name, consumer.kind, consumer.path, input_gradient,
                     consumer.input_range)
    for path, nan_inf in weight_gradients:
        if any(nan_inf):
            return birth("backward", path, "weight gradient", path, nan_inf, None)
    return None


def locate(calls, loss=None, prediction_range=None, weights=(), data=(None, None, None),
           input_gradient=(0, 0), weight_gradients=(), unseen_operation="the replay does not record"):
    """Where a replayed step's first NaN/Inf was born, as `kgrad.NonFiniteReport` ``born_*`` fields.

    Args:
        calls: The `Call`s of the forward pass, in order.
        loss: The `Loss`, or ``None`` if it was not computed.
        prediction_range: ``(min, max)`` of the finite values of the prediction, or ``None``.
        weights: ``[(path, values)]`` of the model's weights, checked first
            (a replay reads them before its forward pass changes any statistic).
        data: ``(inputs, targets, sample_weight)`` of the batch (host arrays or tensors).
        input_gradient: ``(nan, inf)`` of dJ/d(the model's inputs).
        weight_gradients: ``[(path, (nan, inf))]`` of the weight gradients, checked last.
        unseen_operation: See `in_forward`.

    Returns:
        A ``dict`` of ``born_*`` fields, or ``None`` if everything is finite.
    """
    return (
        in_weights(weights)
        or in_data(*data)
        or in_forward(calls, loss, prediction_range, unseen_operation)
        or in_backward(calls, prediction_range, input_gradient, weight_gradients)
    )
