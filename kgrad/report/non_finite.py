"""What the guard reports: where a step first went non-finite, in words.

Backend-free: the sentinel and the replay of each backend fill a
`NonFiniteReport`; `kgrad.NonFiniteGuard` prints it and raises `NonFiniteError`.
"""

import dataclasses
import math

#: Kinds computed by the forward pass; the rest come from the backward pass.
FORWARD_KINDS = ("input", "activation", "prediction", "loss")

#: A replayed birth's ``kind``, by its ``born_in``.
_KIND_OF_BIRTH = {"forward": "activation", "backward": "grad", "data": "input", "weights": "weight"}

@dataclasses.dataclass(frozen=True)
class NonFiniteReport:
    """Where a step first went non-finite.

    Returned by `kgrad.first_non_finite` and kept by `kgrad.NonFiniteGuard`
    (``guard.report``); ``str(report)`` is the message printed.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> model = keras.Sequential([keras.Input((2,)),
    ...     keras.layers.Dense(2, name="hidden"), keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> x = np.ones((4, 2), "float32"); x[3, 1] = np.inf
    >>> guard = kgrad.NonFiniteGuard()
    >>> _ = model.fit(x, np.ones((4, 1)), batch_size=2, callbacks=[guard],
    ...               shuffle=False, verbose=0)
    >>> report = guard.report
    >>> report.step, report.kind, report.last_finite_step  # what the every-step check saw
    (1, 'loss', 0)
    >>> report.born_in, report.born_at, report.born_inf_count, report.batch_index  # the replay
    ('data', 'input', 1, 1)

    Attributes:
        step: ``optimizer.iterations`` of the bad step.
        tensor: Name of the first non-finite tensor, e.g. ``"grad/dense_2"``.
        layer: The layer (or tap, input, output, weight path) it belongs to.
        kind: ``"input"``, ``"activation"``, ``"prediction"``,
            ``"pred_grad"``, ``"grad"`` (dJ/d activation) or ``"weight_grad"``.
        pass_: ``"forward"`` or ``"backward"``.
        nan_count: NaN elements in that tensor.
        inf_count: Inf elements in that tensor.
        last_finite_step: The latest step on which every watched tensor was
            finite (``None`` if there was none).
        last_finite_norm: L2 norm of the same tensor on that step (``None`` for dJ/dŷ, only
            computed on a tripped step, and when its float32 sum of squares overflowed or underflowed).
        last_finite_norm_below: Where it underflowed (values under ~1e-19, whose squares float32
            flushes to 0), a bound the norm is under; else ``None``.
        last_summaries: Full summaries of that layer from the latest probed
            step, when a `kgrad.GradientProbe` ran alongside (else ``{}``).
        non_finite: ``dict`` tensor name -> (nan_count, inf_count) of every
            non-finite tensor of the step, in check order.
        born_in: Where the first NaN/Inf was born, found by replaying the
            step (`kgrad.backends.common.locate`): ``"forward"``, ``"backward"``, ``"data"``
            (it arrived with the inputs, targets or sample weights) or
            ``"weights"`` (an earlier update made a weight non-finite);
            ``None`` when not replayed (see ``replay_note``).
        born_at: The layer, operation, `kgrad.tap`, input or weight it was
            born at: forward, the first one whose inputs are all finite and
            whose output is not; backward, the first one from the loss down
            whose dJ/d(input) is non-finite while dJ/d(output) is finite.
        born_type: Its class name (``"Lambda"``, ``"Sqrt"``, ``"kgrad.tap"``...).
        born_path: Its path in nested models (``"outer/inner"``).
        born_nan_count, born_inf_count: NaN and Inf elements of its output
            (backward: of dJ/d(its input)).
        born_input_range: ``(min, max)`` of the finite values of its (first)
            input, or ``None`` if it has none.
        born_inside: The `kgrad.tap` inside that layer where the value was
            first seen non-finite, or ``None``.
        born_step: For ``born_in="weights"``, the step whose update made
            the weight non-finite (the last update applied); else ``step``.
        born_tape: In a model's own ``train_step``, the `kgrad.ProbeTape` or
            `kgrad.value_and_grad` (its logged name) whose pass the value was
            born in; else ``None``.
        batch_index: The batch within the epoch (``None`` when unknown: with
            ``steps_per_execution > 1`` and a batch that variables cannot
            hold, ragged or strings).
        replayed: ``True`` if the replay reproduced the trip, ``False`` if it
            did not (then the fields above are ``None`` and the sentinel's
            fields are what is known), ``None`` if there was no replay.
        replay_note: Why there is no replay or it did not reproduce the
            trip, or what may make the replay differ from the step.
        reproduce: The three lines of Python that replay the step from the
            files of ``NonFiniteGuard(dump_dir=...)``, or ``None``.
    """

    step: int
    tensor: str
    layer: str
    kind: str
    pass_: str
    nan_count: int
    inf_count: int
    last_finite_step: object
    last_finite_norm: object
    last_summaries: dict
    non_finite: dict
    last_finite_norm_below: object = None
    born_in: object = None
    born_at: object = None
    born_type: object = None
    born_path: object = None
    born_nan_count: object = None
    born_inf_count: object = None
    born_input_range: object = None
    born_inside: object = None
    born_step: object = None
    born_tape: object = None
    batch_index: object = None
    replayed: object = None
    replay_note: object = None
    reproduce: object = None

    def __str__(self):
        return self.message()

    def message(self, closing=None):
        """``str(report)``, with ``closing`` (a sentence) before the code that replays the step.

        The replay's lines come last, each on a line of its own, so that they
        can be copied and run as printed.
        """
        lines = [
            f"Non-finite values at step {self.step}: first in {self.pass_} order is "
            f"{self.kind} of {self.layer!r} ({self.tensor}) with {self.nan_count} NaN "
            f"and {self.inf_count} Inf."
        ]
        last = self.last_finite_step
        if last is not None and self.last_finite_norm is not None:
            lines.append(f"On the last finite step ({last}) its L2 norm was {self.last_finite_norm:.6g}.")
        elif last is not None and self.last_finite_norm_below is not None:
            bound = self.last_finite_norm_below
            lines.append(f"On the last finite step ({last}) its L2 norm was below {bound:.2g}, too small for "
                         "the guard's float32 sum of squares to measure exactly (a kgrad.GradientProbe's "
                         "norms measure it).")
        elif last is not None:
            lines.append(f"The last finite step was {last}.")
        others = [name for name in self.non_finite if name != self.tensor]
        if others:
            lines.append(f"Also non-finite on this step: {', '.join(others[:10])}"
                         + (" ..." if len(others) > 10 else "") + ".")
        text = " ".join(lines + describe_birth(self) + ([closing] if closing else []))
        if self.reproduce:
            text += f"\nTo replay it, run:\n{self.reproduce}"
        return text


class NonFiniteError(RuntimeError):
    """Raised by `kgrad.NonFiniteGuard(action="raise")`; ``.report`` says where.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> x = np.ones((4, 2), "float32"); x[2, 0] = np.nan
    >>> try:
    ...     model.fit(x, np.ones((4, 1)), batch_size=2, verbose=0, shuffle=False,
    ...               callbacks=[kgrad.NonFiniteGuard(action="raise")])
    ... except kgrad.NonFiniteError as error:
    ...     print(error.report.step, error.report.born_in, error.report.born_nan_count)
    1 data 1
    """

    def __init__(self, report):
        super().__init__(str(report))
        self.report = report


#: A float32 square under 2**-126 (TensorFlow's halved ones: 2**-125) flushes to 0: a sum over up to 2**40
#: elements misses at most 2**-85, which above 2**-62 (a norm above ~4.7e-10) moves the norm by less than
#: float32's rounding (2**-24); below, the sum only bounds the norm.
_MISSED_SQUARES = 2.0**-85
_EXACT_SQUARES = 2.0**-62


def report_of_counts(non_finite, step, last_finite_step=None, last_finite_squares=None,
                     last_summaries_for=None):
    """The `NonFiniteReport` of a step whose check counted NaN/Inf, or ``None`` if it counted none.

    Written once for every backend's sentinel and for `kgrad.first_non_finite`.

    Args:
        non_finite: ``dict`` tensor name -> ``(nan, inf)`` in check order
            (forward, then backward); tensors with none are left out.
        step: The step checked.
        last_finite_step: The latest step on which everything was finite,
            or ``None`` (a negative value, a device's "none yet", too).
        last_finite_squares: ``fn(tensor name) -> float or None``, that tensor's
            float32 sum of squares on ``last_finite_step``: its norm if the sum
            neither overflowed nor underflowed, a bound (``last_finite_norm_below``)
            if it underflowed.
        last_summaries_for: ``fn(layer, last_finite_step) -> dict`` of the
            latest probed summaries of that layer (default: none).

    Example:

    >>> report = report_of_counts({"activation/a": (0, 0), "grad/b": (2, 0)}, step=7, last_finite_step=6,
    ...                           last_finite_squares=lambda name: 4.0)
    >>> report.tensor, report.layer, report.pass_, report.nan_count, report.last_finite_norm
    ('grad/b', 'b', 'backward', 2, 2.0)
    >>> tiny = report_of_counts({"grad/b": (2, 0)}, 7, 6, last_finite_squares=lambda name: 0.0)
    >>> tiny.last_finite_norm, f"{tiny.last_finite_norm_below:.2g}"  # values under ~1e-19 square to 0
    (None, '1.6e-13')
    >>> report.non_finite  # the tensors without NaN/Inf are left out
    {'grad/b': (2, 0)}
    """
    bad = {name: (int(nan), int(inf)) for name, (nan, inf) in non_finite.items() if nan or inf}
    if not bad:
        return None
    first = next(iter(bad))
    kind, layer = split_name(first)
    if last_finite_step is not None and last_finite_step < 0:
        last_finite_step = None
    squares = None if last_finite_step is None or last_finite_squares is None else last_finite_squares(first)
    squares = float(squares) if squares is not None and math.isfinite(squares) else None  # overflowed
    return NonFiniteReport(
        step=step, tensor=first, layer=layer, kind=kind,
        pass_="forward" if kind in FORWARD_KINDS else "backward",
        nan_count=bad[first][0], inf_count=bad[first][1], last_finite_step=last_finite_step,
        last_finite_norm=math.sqrt(squares) if squares is not None and squares >= _EXACT_SQUARES else None,
        last_finite_norm_below=(math.sqrt(squares + _MISSED_SQUARES)
                                if squares is not None and squares < _EXACT_SQUARES else None),
        last_summaries=last_summaries_for(layer, last_finite_step) if last_summaries_for is not None else {},
        non_finite=bad,
    )


def report_of_birth(born, step=None):
    """The `NonFiniteReport` of a replay that found where the first NaN/Inf was born.

    Args:
        born: The ``born_*`` fields of `kgrad.backends.common.locate.locate`
            (and a ``replay_note``, if any).
        step: The step replayed, for the report.

    Example:

    >>> born = {"born_in": "forward", "born_at": "log", "born_type": "Lambda", "born_path": "log",
    ...         "born_nan_count": 0, "born_inf_count": 1, "born_input_range": (0.0, 1.0)}
    >>> report = report_of_birth(born, step=3)
    >>> report.tensor, report.pass_, report.inf_count, report.replayed
    ('activation/log', 'forward', 1, True)
    """
    kind = _KIND_OF_BIRTH[born["born_in"]]
    return NonFiniteReport(
        step=step, tensor=f"{kind}/{born['born_at']}", layer=born["born_at"], kind=kind,
        pass_="backward" if born["born_in"] == "backward" else "forward",
        nan_count=born["born_nan_count"], inf_count=born["born_inf_count"], last_finite_step=None,
        last_finite_norm=None, last_summaries={}, non_finite={}, replayed=True, **born,
    )


def name_in_part(tensor_name, part):
    """``"<kind>/<layer>"`` of a part's checked tensor (a `kgrad.ProbeTape`, a `kgrad.value_and_grad`)
    as ``"<kind>/<part>/<layer>"``.

    >>> name_in_part("grad/dense", "generator")
    'grad/generator/dense'
    """
    kind, _, layer = tensor_name.partition("/")
    return f"{kind}/{part}/{layer}"


def split_name(tensor_name):
    """``"grad/dense_1"`` -> (``"grad"``, ``"dense_1"``)."""
    kind, _, layer = tensor_name.partition("/")
    return kind, layer


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
    return lines
