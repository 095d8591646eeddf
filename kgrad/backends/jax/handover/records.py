"""The records of probed JAX steps, kept on the device until the host reads them after a step that logs.

A probed step returns its record ``(step, scalars, histograms)`` as device
arrays; the train function appends them here without reading them, so
steps are dispatched asynchronously as Keras dispatches them. `read_since`
copies the new ones to the host (the only device read) and lets the device
arrays go.
"""

import threading

import jax
import numpy as np

from kgrad.logs.record import ProbeRecord


class RecordBuffer:
    """Device records of one probed model, read by a `kgrad.GradientProbe` (an `interface.HandOver`).

    Args:
        names: ``fn() -> (scalar names, histogram names)`` of the records.
        weight_shapes: ``{weight path: shape}`` of the probed weights.
    """

    def __init__(self, names, weight_shapes):
        self._names = names
        self.weight_shapes = weight_shapes
        self._unread = []  # device records not read yet, oldest first
        self._appended = 0  # records appended since the buffer was made
        # Keras may run a callback's on_train_batch_end in a worker thread (async dispatch).
        self._lock = threading.Lock()
        self._keep_latest_only = False

    def append(self, record):
        """Keeps a device record; reads nothing."""
        with self._lock:
            self._unread.append(record)
            self._appended += 1
            if self._keep_latest_only:
                del self._unread[:-1]

    def keep_latest_only(self):
        """Keeps only the newest unread record (when nothing reads them all: `kgrad.ProbingModel`)."""
        self._keep_latest_only = True

    def clear(self):
        """Drops the records not read (a fit that raised left them)."""
        with self._lock:
            self._unread = []

    def read_since(self, delivered, latest=None):
        """``(records, delivered)``: the `kgrad.ProbeRecord`s appended after the first ``delivered``."""
        del latest  # TensorFlow's every-step record; the JAX step always appends
        with self._lock:
            unread, self._unread = self._unread, []
            appended = self._appended
        first = appended - len(unread)
        unread = unread[max(delivered - first, 0) :]
        if not unread:
            return [], max(delivered, appended)
        scalar_names, histogram_names = self._names()
        records = []
        for step, scalars, histograms in jax.device_get(unread):
            if step < 0:  # a step after a NonFiniteGuard's trip: it applied nothing, nothing to log
                continue
            records.append(
                ProbeRecord(
                    int(step),
                    dict(zip(scalar_names, np.asarray(scalars, np.float64).tolist())),
                    dict(zip(histogram_names, np.asarray(histograms))),
                )
            )
        return records, appended
