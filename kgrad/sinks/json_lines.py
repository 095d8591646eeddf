"""`JsonLinesSink`: one JSON object per line and per record, for pandas and anything else."""

import json
import os

from kgrad.sinks.base import Sink, counts_and_edges


class JsonLinesSink(Sink):
    """Appends each record to a JSON Lines file: one line per probed step, one per guard report.

    A probed step: ``{"record": "probe", "step": 10, "tape": null,
    "grad_norm/dense": 0.25, ..., "histograms": {tag: {"edges": [k + 1
    floats], "counts": [k ints]}}}``: each scalar tag is a key of its own (a
    column of ``pandas.read_json(path, lines=True)``; every kgrad tag holds a
    ``/``), with the tags and values TensorBoard's event files get (``tape``
    names a `kgrad.ProbeTape` of a model's own ``train_step``). A
    tripped `kgrad.NonFiniteGuard`: ``{"record": "guard_report", "step": 3,
    "report": {...}}``, the fields of TensorBoard's ``guard/report`` tag.
    NaN and Inf are written as JSON's common extensions ``NaN``, ``Infinity``
    (read by Python's ``json`` and by pandas). Lines reach the file at each
    epoch's end.

    Args:
        path: The file; appended to, its folder created. Open it with
            ``pandas.read_json(path, lines=True)``.
        histograms: Whether histograms are written.
        queue_size: See `kgrad.Sink`.
        close_timeout: See `kgrad.Sink`.

    Example:

    >>> import json, os, tempfile, keras, kgrad, numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "probe.jsonl")
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> probe = kgrad.GradientProbe(every_n_steps=2, sinks=[kgrad.JsonLinesSink(path)])
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=2, callbacks=[probe], verbose=0)
    >>> lines = [json.loads(line) for line in open(path)]
    >>> [line["step"] for line in lines], sorted(lines[0]["histograms"]["grad_hist/out"])
    ([0, 2], ['counts', 'edges'])
    """

    def __init__(self, path, histograms=True, queue_size=100, close_timeout=30.0):
        super().__init__(queue_size=queue_size, close_timeout=close_timeout)
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"`path` must be a file path (str or os.PathLike). Received: path={path!r}. "
                "Example: kgrad.JsonLinesSink('logs/run1/kgrad.jsonl')."
            )
        self.path = os.fspath(path)
        self.histograms = bool(histograms)
        self._file = None

    def open(self):
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as error:
            raise ValueError(
                f"kgrad.JsonLinesSink cannot write path={self.path!r}: {error.strerror or error}. "
                "Pass a file in a folder you can write to."
            ) from error

    def write_record(self, record):
        line = {"record": "probe", "step": int(record.step), "tape": record.tape}
        line.update((tag, float(value)) for tag, value in record.scalars.items())
        if self.histograms:
            line["histograms"] = {}
            for tag, buckets in record.histograms.items():
                counts, edges = counts_and_edges(buckets)
                line["histograms"][tag] = {"edges": edges.tolist(), "counts": counts.tolist()}
        self._write(line)

    def write_guard_report(self, step, fields):
        self._write({"record": "guard_report", "step": int(step), "report": fields})

    def _write(self, line):
        self._file.write(json.dumps(line) + "\n")

    def flush(self):
        self._file.flush()

    def close(self):
        self._file.close()
