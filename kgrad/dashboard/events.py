"""Every event of kgrad's runs that the tab draws, read straight from the event files, cached.

The tab must show every probed step: it reads the event files with
`kgrad.logs.fast_reader`, keeping the scalar tags it draws (`SCALAR_PREFIXES`)
and the text summaries (the `kgrad.NonFiniteGuard` report).

`LogCache` keeps each run's values until one of its event files changes
size or modification time, so a request re-reads only runs that grew.
"""

import json
import os
import threading
import time

from kgrad.logs import fast_reader
from kgrad.logs.fast_reader import find_runs
from kgrad.plan.tag_names import GUARD_REPORT_TAG

#: Scalar tags the dashboard draws or the health report needs (prefixes).
SCALAR_PREFIXES = (
    "grad_norm/",
    "weight_grad_norm/",
    "update_ratio/",
    "weight_norm/",
    "activation_zero_fraction/",
    "global/grad_norm",
    # The stability view's signals (instruments=["optimizer", "logits", "attention"]).
    "global/loss",
    "adam_rms/",
    "logit_max_max/",
    "attention_logit_max/",
    # The steps a NonFiniteGuard skipped as spikes, and its replay's values of each.
    "global/step_skipped",
    "global/spike_score",
    "spike_window_",
    "skip_",
)
#: Scalar tags that count NaN/Inf: ``<kind>_nonfinite/<name>``.
NONFINITE_MARK = "_nonfinite/"
#: Text tags of kgrad (the guard's report, `kgrad.plan.tag_names.GUARD_REPORT_TAG`).
TEXT_PREFIX = GUARD_REPORT_TAG.partition("/")[0] + "/"


def _wanted_scalar(tag):
    return tag.startswith(SCALAR_PREFIXES) or NONFINITE_MARK in tag


def read_run(paths):
    """The tab's data of one run (`kgrad.logs.fast_reader.read_run` of the scalars it draws)."""
    return fast_reader.read_run(paths, wanted_scalar=_wanted_scalar)


def guard_reports(run):
    """The `kgrad.NonFiniteGuard` reports logged in a run, as dicts (bad JSON left out)."""
    reports = []
    for tag, items in run["texts"].items():
        if tag.startswith(TEXT_PREFIX):
            for _, text in items:
                try:
                    report = json.loads(text)
                except ValueError:
                    continue
                if isinstance(report, dict):
                    reports.append(report)
    return reports


class LogCache:
    """The runs under a log directory, re-read only when their files change.

    Safe to call from TensorBoard's request threads. The directory is listed
    at most every ``rescan_s`` seconds.

    Args:
        log_dir: The directory given to ``tensorboard --logdir``.
        rescan_s: Seconds between two listings of the directory.

    Example:

    >>> import tempfile, tensorflow as tf
    >>> from kgrad.dashboard.events import LogCache
    >>> log_dir = tempfile.mkdtemp()
    >>> with tf.summary.create_file_writer(log_dir + "/kgrad").as_default():
    ...     _ = tf.summary.scalar("grad_norm/dense", 0.5, step=3)
    >>> LogCache(log_dir).runs()["kgrad"]["scalars"]["grad_norm/dense"].steps.tolist()
    [3]
    """

    def __init__(self, log_dir, rescan_s=2.0):
        self.log_dir = os.fspath(log_dir)
        self._rescan_s = rescan_s
        self._lock = threading.Lock()
        self._runs = {}  # run -> (signature, data)
        self._scanned_at = -float("inf")

    def runs(self):
        """``{run: data}`` of `read_run`, for every run with event files, sorted by name."""
        with self._lock:
            if time.monotonic() - self._scanned_at >= self._rescan_s:
                self._refresh()
            return {run: data for run, (_, data) in sorted(self._runs.items())}

    def _refresh(self):
        found = find_runs(self.log_dir) if os.path.isdir(self.log_dir) else {}
        fresh = {}
        for run, paths in found.items():
            signature = tuple(_file_signature(path) for path in paths)
            cached = self._runs.get(run)
            fresh[run] = cached if cached and cached[0] == signature else (signature, read_run(paths))
        self._runs = fresh
        self._scanned_at = time.monotonic()


def _file_signature(path):
    try:
        status = os.stat(path)
    except OSError:
        return (path, -1, -1)
    return (path, status.st_size, status.st_mtime_ns)
