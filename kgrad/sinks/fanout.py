"""`SinkSet`: what a callback does with its ``sinks=[...]``: open, hand records over, close.

The callbacks call it on the training thread; every call only queues work
for each sink's worker (`kgrad.sinks.worker`). The HTML report is rendered
in the first worker that needs it, once for all the sinks of that moment.
"""

import threading
import warnings

from kgrad.logs.writer import guard_report_fields
from kgrad.sinks import worker
from kgrad.sinks.base import Sink


def checked_sinks(sinks):
    """``sinks`` as a tuple of `kgrad.Sink`s, or a Keras-style error.

    >>> checked_sinks(None)
    ()
    >>> checked_sinks(["wandb"])
    Traceback (most recent call last):
    ...
    TypeError: `sinks` must be a list of kgrad sinks (kgrad.WandbSink(...), kgrad.MlflowSink(...), \
kgrad.JsonLinesSink(path) or a kgrad.Sink subclass). Received: sinks=['wandb'] (item 0 is a str).
    """
    items = () if sinks is None else sinks
    if isinstance(items, Sink):
        items = (items,)
    problem = None
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        problem = f"a {type(sinks).__name__}"
    else:
        items = tuple(items)
        wrong = [(index, item) for index, item in enumerate(items) if not isinstance(item, Sink)]
        if wrong:
            problem = f"item {wrong[0][0]} is a {type(wrong[0][1]).__name__}"
    if problem is not None:
        raise TypeError(
            "`sinks` must be a list of kgrad sinks (kgrad.WandbSink(...), kgrad.MlflowSink(...), "
            f"kgrad.JsonLinesSink(path) or a kgrad.Sink subclass). Received: sinks={sinks!r} ({problem})."
        )
    return items


class SinkSet:
    """A callback's sinks, between ``fit``'s start (`open`) and end (`close`).

    Args:
        sinks: What `checked_sinks` returns.
        owner: The callback's name, for messages (``"GradientProbe"``).
    """

    def __init__(self, sinks, owner):
        self.sinks = sinks
        self._owner = owner
        self._workers = []
        self._said_no_report = False

    def open(self, enabled=True):
        """Opens every sink (training thread); if one cannot open, those already opened are closed.

        ``enabled=False`` (a worker that is not the chief) opens none: the others get nothing.
        Sinks still open from this callback's previous fit (it raised, so Keras called no
        ``on_train_end``) are closed first: their queued records are delivered, and the sink
        starts this fit as a fresh one.
        """
        self._release()
        if not enabled:
            return
        try:
            for sink in self.sinks:
                self._workers.append(worker.acquire(sink))
        except BaseException:
            self._release()
            raise

    def write(self, record):
        """Queues one probed step's record (the one TensorBoard gets) for every sink."""
        for sink_worker in self._workers:
            sink_worker.offer("write_record", record)

    def guard_report(self, report):
        """Queues a tripped guard's `kgrad.NonFiniteReport` for every sink."""
        fields = guard_report_fields(report)
        for sink_worker in self._workers:
            sink_worker.offer("write_guard_report", report.step, fields)

    def html_report(self, log_dir, step, label):
        """Queues the HTML report of ``log_dir`` for the sinks that attach it.

        Without a ``log_dir`` there are no event files to build it from: said once.
        """
        wanting = [sink_worker for sink_worker in self._workers if sink_worker.sink.wants_html_report]
        if not wanting:
            return
        if log_dir is None:
            if not self._said_no_report:
                self._said_no_report = True
                warnings.warn(
                    f"kgrad.{self._owner}(log_dir=None) writes no event files, so no HTML report is "
                    "attached to its sinks. Pass a log_dir to get one.", RuntimeWarning, stacklevel=3,
                )
            return
        page = _Page(log_dir)
        for sink_worker in wanting:
            sink_worker.offer(_attach_html_report, page, step, label)

    def flush(self):
        """Queues a flush for every sink (the end of each epoch)."""
        for sink_worker in self._workers:
            sink_worker.offer("flush", counted=False)

    def close(self, attach_report=False, log_dir=None, step=0):
        """Closes the sinks this set opened, each waiting its ``close_timeout`` at most.

        Args:
            attach_report: Whether the HTML report of ``log_dir`` is attached first (the end of ``fit``).
            log_dir: The log directory of the report (``None``: said once, no report).
            step: The latest probed step, where the report is attached.
        """
        if attach_report:
            self.html_report(log_dir, step, "end_of_fit")
        self._release()

    def _release(self):
        workers, self._workers = self._workers, []
        for sink_worker in workers:
            worker.release(sink_worker.sink)


class _Page:
    """The HTML report of ``log_dir``, rendered once, by the first worker that asks."""

    def __init__(self, log_dir):
        self._log_dir = log_dir
        self._lock = threading.Lock()
        self._text = None

    def text(self):
        with self._lock:
            if self._text is None:
                # The report's reading and rendering: imported only when a sink attaches it.
                from kgrad.dashboard import html_report as html

                self._text = html.render_html(html.report_data(self._log_dir))
            return self._text


def _attach_html_report(sink, page, step, label):
    sink.attach_html_report(page.text(), step, label)
