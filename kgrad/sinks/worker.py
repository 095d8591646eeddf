"""One worker thread and one bounded queue per `kgrad.Sink`: trackers never hold training up.

The training thread only appends a call to a queue (a lock and a deque
append); the worker makes the calls in order. A call that finds the queue
full is dropped, one that raises is counted, and the end of ``fit`` waits
``close_timeout`` seconds at most for the queue to drain. Warnings are issued
on the training thread: the first problem when it is seen, the count at the
end.

A sink given to both `kgrad.GradientProbe` and `kgrad.NonFiniteGuard` has one
worker: `acquire` opens it for the first callback, `release` closes it for
the last.

A fit that raises never reaches ``on_train_end``: its workers are closed when
the callback's next fit opens them again (`kgrad.sinks.fanout.SinkSet.open`)
or, at the latest, when the interpreter exits (`close_open_workers`), so the
records queued before the error still reach the tracker.
"""

import atexit
import collections
import threading
import warnings

_STOP = object()
#: Workers not closed yet. A daemon thread dies with the interpreter, its queue unsent: closed at exit.
_open_workers = set()
# id(sink) -> [callbacks that have it open, its worker], while one has: kgrad's state is kept
# here, not on the user's sink. By id, as a sink need not be hashable (a dataclass); the worker
# holds the sink, so its id is not reused while the entry lives, and the entry goes with the
# last `release` (or at exit).
_IN_USE = {}


class SinkWorker:
    """Calls ``sink``'s methods in a thread of their own, through a queue of ``sink.queue_size`` calls.

    Example:

    >>> import kgrad
    >>> class Slow(kgrad.Sink):
    ...     def write_record(self, record):
    ...         self.seen = record
    >>> worker = SinkWorker(Slow())
    >>> worker.offer("write_record", "a record")
    True
    >>> worker.close(timeout=5)
    >>> worker.sink.seen, worker.sink.delivered, worker.sink.dropped
    ('a record', 1, 0)
    """

    def __init__(self, sink):
        self.sink = sink
        self._name = type(sink).__name__
        self._jobs = collections.deque()
        self._condition = threading.Condition()
        self._abandoned = False
        self._in_flight = False  # a counted call is running
        self.delivered = self.full = self.failed = self.left = 0
        self._first_problem = None
        self._warned = False
        self._thread = threading.Thread(target=self._run, name=f"kgrad-{self._name}", daemon=True)
        self._thread.start()
        _open_workers.add(self)

    def offer(self, method, *args, counted=True, force=False):
        """Queues ``sink.<method>(*args)``, or ``method(sink, *args)`` for a function; ``False`` if
        the queue was full (the call is dropped).

        ``counted`` calls are records (counted as delivered or dropped);
        ``force`` queues past the bound (the close, which must run).
        """
        with self._condition:
            queued = force or len(self._jobs) < self.sink.queue_size
            if queued:
                self._jobs.append((method, args, counted))
                self._condition.notify()
            else:
                self.full += counted
                self._problem(f"its queue of {self.sink.queue_size} calls was full: the tracker is slower "
                              "than training")
        self._warn_first_problem()
        return queued

    def _run(self):
        while True:
            with self._condition:
                while not self._jobs:
                    self._condition.wait()
                method, args, counted = self._jobs.popleft()
                if method is _STOP:
                    return
                if self._abandoned and counted:
                    continue  # counted as left when the end of fit stopped waiting
                self._in_flight = counted
            try:
                if callable(method):
                    method(self.sink, *args)
                else:
                    getattr(self.sink, method)(*args)
            except Exception as error:  # noqa: BLE001 - a tracker's failure must not reach training
                name = getattr(method, "__name__", method).lstrip("_")
                with self._condition:
                    self.failed += counted
                    self._problem(f"{self._name}.{name} raised {type(error).__name__}: {error}")
            else:
                with self._condition:
                    self.delivered += counted
            finally:
                with self._condition:
                    self._in_flight = False

    def _problem(self, text):
        if self._first_problem is None:
            self._first_problem = text

    def _warn_first_problem(self):
        with self._condition:
            problem = None if self._warned else self._first_problem
            self._warned = self._warned or problem is not None
        if problem is not None:
            warnings.warn(
                f"kgrad.{self._name}: {problem}. Training goes on; records this sink loses are counted "
                "and reported when fit ends (this warning is shown once).",
                RuntimeWarning, stacklevel=4,
            )

    def close(self, timeout):
        """Queues the sink's `close`, waits ``timeout`` seconds at most, and reports what was lost."""
        _open_workers.discard(self)
        self.offer("close", counted=False, force=True)
        with self._condition:
            self._jobs.append((_STOP, (), False))
            self._condition.notify()
        self._thread.join(timeout)
        with self._condition:
            if self._thread.is_alive():
                self._abandoned = True
                self.left = sum(counted for _, _, counted in self._jobs) + self._in_flight
            self.sink.delivered = self.delivered
            self.sink.dropped = self.full + self.failed + self.left
        self._warn_first_problem()
        if self.sink.dropped:
            warnings.warn(
                f"kgrad.{self._name} lost {self.sink.dropped} of {self.sink.dropped + self.delivered} "
                f"records this fit: {self.full} dropped (queue full), {self.failed} failed, {self.left} "
                f"not delivered when fit ended (close_timeout={self.sink.close_timeout:g} s). First "
                f"problem: {self._first_problem}.",
                RuntimeWarning, stacklevel=3,
            )


def acquire(sink):
    """Opens ``sink`` (on the calling, training thread) and starts its worker, unless another callback did."""
    entry = _IN_USE.get(id(sink))
    if entry is None:
        sink.delivered = sink.dropped = 0
        sink.open()
        entry = _IN_USE[id(sink)] = [0, SinkWorker(sink)]
    entry[0] += 1
    return entry[1]


def release(sink):
    """Closes ``sink``'s worker when its last callback lets it go."""
    entry = _IN_USE.get(id(sink))
    if entry is None:
        return  # closed at the interpreter's exit already
    entry[0] -= 1
    if entry[0] == 0:
        del _IN_USE[id(sink)]
        entry[1].close(sink.close_timeout)


def users(sink):
    """How many callbacks have ``sink`` open now (0: it is closed).

    >>> import kgrad
    >>> sink = kgrad.Sink()
    >>> opened = acquire(sink), acquire(sink)  # a probe's and a guard's
    >>> release(sink)
    >>> users(sink)
    1
    >>> release(sink)
    >>> users(sink), [name for name in vars(sink) if "kgrad" in name]  # nothing left on the sink
    (0, [])
    """
    entry = _IN_USE.get(id(sink))
    return 0 if entry is None else entry[0]


@atexit.register
def close_open_workers():
    """Closes every worker still open (a fit that raised), each waiting its sink's ``close_timeout``.

    Runs at interpreter exit, before daemon threads are stopped, so a script that dies of an
    error still delivers what it had queued and closes its trackers' runs.
    """
    for open_worker in list(_open_workers):
        _IN_USE.pop(id(open_worker.sink), None)
        open_worker.close(open_worker.sink.close_timeout)
