"""`Sink`: where kgrad's records go besides TensorBoard's event files, and what every sink shares.

A sink receives what the probe and the guard write: each probed step's
`kgrad.ProbeRecord` (the same one TensorBoard gets), a tripped guard's report
and, at the end of ``fit`` and on a trip, the HTML report. Its methods run in
a worker thread of its own (`kgrad.sinks.worker`), after kgrad's device read,
so that a slow or failing tracker never holds training up; only `open` runs
on the training thread, when ``fit`` starts.
"""

import importlib
import numbers

import numpy as np


class Sink:
    """Base class of kgrad's sinks: override the methods a tracker needs, as with a Keras callback.

    Pass sinks to `kgrad.GradientProbe` and `kgrad.NonFiniteGuard` with
    ``sinks=[...]``; one sink may serve both (it is opened once). Calls are
    made in order, in one worker thread per sink, through a bounded queue: a
    record that finds the queue full is dropped and counted, a call that
    raises is counted, the first problem is warned about, and the end of
    ``fit`` says how many records were lost (`dropped`).

    Args:
        queue_size: Calls waiting for the worker at most; more are dropped.
            Each holds a record (its histograms included) until it is made:
            100 records are 1,000 steps of a stalled tracker at
            ``every_n_steps=10``, in a bounded amount of memory.
        close_timeout: Seconds the end of ``fit`` waits for the queue to
            drain; what is still queued then is dropped (and counted).

    Attributes:
        delivered: Records (probed steps, reports) the last ``fit`` delivered.
        dropped: Records it lost: queue full, the call raised, or still
            queued when ``fit`` ended.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> class Steps(kgrad.Sink):
    ...     def open(self):
    ...         self.steps = []
    ...     def write_record(self, record):
    ...         self.steps.append(record.step)
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> sink = Steps()
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=2, verbose=0,
    ...               callbacks=[kgrad.GradientProbe(every_n_steps=2, sinks=[sink])])
    >>> sink.steps, sink.delivered, sink.dropped
    ([0, 2], 2, 0)
    """

    def __init__(self, queue_size=100, close_timeout=30.0):
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(
                f"`queue_size` must be a positive int. Received: queue_size={queue_size!r}. "
                "Example: queue_size=100."
            )
        if isinstance(close_timeout, bool) or not isinstance(close_timeout, numbers.Real) or not (
            close_timeout >= 0
        ):
            raise ValueError(
                "`close_timeout` must be a number of seconds >= 0. Received: "
                f"close_timeout={close_timeout!r}. Example: close_timeout=30."
            )
        self.queue_size = queue_size
        self.close_timeout = float(close_timeout)
        self.delivered = 0
        self.dropped = 0

    def open(self):
        """Called on the training thread when ``fit`` starts: find or start the tracker's run.

        Raise here (a Keras-style ``ValueError``) when the sink cannot work:
        ``fit`` then stops before its first step.
        """

    def write_record(self, record):
        """Writes one probed step's `kgrad.ProbeRecord` (worker thread)."""

    def write_guard_report(self, step, fields):
        """Writes a tripped `kgrad.NonFiniteGuard`'s report (worker thread).

        Args:
            step: The step that tripped.
            fields: The report as JSON-ready values, as TensorBoard's
                ``guard/report`` tag holds it (`kgrad.logs.writer.guard_report_fields`).
        """

    def attach_html_report(self, html, step, label):
        """Attaches the HTML report (``kgrad report --html``'s page) to the run (worker thread).

        Args:
            html: The page's text.
            step: The latest probed step (or the tripped step).
            label: ``"end_of_fit"``, or ``"nonfinite"`` on a guard trip.
        """

    def flush(self):
        """Pushes what is buffered to disk or to the tracker (worker thread; each epoch's end)."""

    def close(self):
        """Flushes and ends what `open` started (worker thread; the end of ``fit``)."""

    @property
    def wants_html_report(self):
        """Whether `attach_html_report` does something (the report is rendered only then)."""
        return type(self).attach_html_report is not Sink.attach_html_report


class TrackerSink(Sink):
    """What `kgrad.WandbSink` and `kgrad.MlflowSink` share: their package, tag prefix and options.

    Args:
        module: The tracker's package, imported now (``ImportError`` naming ``extra`` without it).
        extra: kgrad's extra that installs it (``pip install "kgrad[<extra>]"``).
        prefix, histograms, report, queue_size, close_timeout: The sink's arguments.
    """

    def __init__(self, module, extra, prefix, histograms, report, queue_size, close_timeout):
        super().__init__(queue_size=queue_size, close_timeout=close_timeout)
        self.tracker = require(module, extra, type(self).__name__)
        self.prefix = check_prefix(prefix)
        self.histograms = bool(histograms)
        self.report = bool(report)

    @property
    def wants_html_report(self):
        return self.report


def require(module, extra, sink):
    """Imports ``module`` or raises an ``ImportError`` that names the extra to install.

    >>> require("json", "wandb", "WandbSink").__name__
    'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"kgrad.{sink} needs the `{module}` package, which is not installed ({error}). "
            f'Install it with: pip install "kgrad[{extra}]"'
        ) from error


def counts_and_edges(buckets):
    """A kgrad histogram's ``[k, 3]`` (left, right, count) buckets as NumPy's ``(counts, edges)``.

    The counts are integers; the ``k + 1`` edges are the left edges and the
    last right edge (kgrad's buckets are contiguous; a gap raises
    ``ValueError`` rather than be papered over).

    >>> counts, edges = counts_and_edges([[0.0, 1.0, 2.0], [1.0, 3.0, 5.0]])
    >>> counts.tolist(), edges.tolist()
    ([2, 5], [0.0, 1.0, 3.0])
    """
    buckets = np.asarray(buckets, np.float64)
    lefts, rights = buckets[:, 0], buckets[:, 1]
    # Edges that differ are a gap, unless both are NaN (a tensor without a finite element).
    # Not np.array_equal(equal_nan=True): twice as slow, and this runs per histogram and step.
    gaps = lefts[1:] != rights[:-1]
    if gaps.any() and not (np.isnan(lefts[1:][gaps]) & np.isnan(rights[:-1][gaps])).all():
        raise ValueError(f"histogram buckets are not contiguous: left edges {lefts}, right edges {rights}")
    return buckets[:, 2].astype(np.int64), np.append(lefts, rights[-1:])


def tag_prefix(prefix, record):
    """Where a record's tags go: ``prefix``, or ``prefix/<tape>`` for a `kgrad.ProbeTape`'s record.

    >>> from kgrad import ProbeRecord
    >>> tag_prefix("kgrad", ProbeRecord(0, {}, {})), tag_prefix("kgrad", ProbeRecord(0, {}, {}, tape="gen"))
    ('kgrad', 'kgrad/gen')
    """
    return prefix if record.tape is None else f"{prefix}/{record.tape}"


def check_prefix(prefix):
    """``prefix``, checked to be a non-empty string without a trailing ``/``."""
    if not isinstance(prefix, str) or not prefix or prefix.endswith("/"):
        raise ValueError(
            f"`prefix` must be a non-empty string without a trailing '/'. Received: prefix={prefix!r}. "
            "Example: prefix='kgrad'."
        )
    return prefix


def check_optional(argument, value, kind, expected, example):
    """``value``, checked to be ``None`` or a ``kind``: a TypeError worded with ``expected`` and ``example``.

    >>> check_optional("run_id", 7, str, "an MLflow run id (str)", "MlflowSink(run_id=run.info.run_id)")
    Traceback (most recent call last):
    ...
    TypeError: `run_id` must be None or an MLflow run id (str). Received: run_id=7. Example: ...
    """
    if value is not None and not isinstance(value, kind):
        raise TypeError(
            f"`{argument}` must be None or {expected}. Received: {argument}={value!r}. Example: {example}."
        )
    return value
