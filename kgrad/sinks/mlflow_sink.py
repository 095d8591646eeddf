"""`MlflowSink`: kgrad's records in an MLflow run (``pip install "kgrad[mlflow]"``)."""

import time

from kgrad.sinks.base import TrackerSink, check_optional, counts_and_edges, tag_prefix

# MLflow's limit on the metrics of one log_batch call (mlflow.utils.validation.MAX_METRICS_PER_BATCH).
_METRICS_PER_BATCH = 1000


class MlflowSink(TrackerSink):
    """Logs kgrad's records to an MLflow run: metrics, histograms, the guard's report, the HTML report.

    Each probed step's scalars are one ``log_batch`` of metrics at the step
    (``optimizer.iterations``, as in TensorBoard), named under ``prefix``
    (``kgrad/grad_norm/dense``; a `kgrad.ProbeTape`'s under ``kgrad/<tape>/``).

    MLflow has no histogram type: each probed step's histograms are one small
    JSON artifact, ``kgrad/histograms/step_000000010.json``, ``{tag: {"edges":
    [...], "counts": [...]}}`` (~20 KB for a 9-layer MLP), read back with
    ``mlflow.artifacts.load_dict``. An artifact per step is written once and
    never rewritten; a summary table would be rewritten whole at each step
    (``mlflow.log_table`` reads the table back and appends) or held until the
    end and lost if the run dies.

    A tripped `kgrad.NonFiniteGuard` adds ``kgrad/guard/nan_count`` and
    ``inf_count`` at its step, the report as
    ``kgrad/guard_report_step_<step>.json`` and its first line as the run's tag
    ``kgrad.guard``. The HTML report (``kgrad report --html``) is the artifact
    ``kgrad/report.html`` at the end of ``fit`` (and
    ``kgrad/report_nonfinite_step_<step>.html`` on a trip).

    Args:
        run_id: The run to log to; ``None``: the active run
            (``mlflow.active_run()``) when ``fit`` starts, e.g. inside
            ``with mlflow.start_run():``.
        prefix: Where kgrad's metrics and artifacts go in the run.
        histograms: Whether each probed step's histograms are logged (a JSON
            artifact per step).
        report: Whether the HTML report is logged as an artifact (it needs the
            callback's ``log_dir``: the report is read from its event files).
        queue_size: See `kgrad.Sink`.
        close_timeout: See `kgrad.Sink`.

    Raises:
        ImportError: If ``mlflow`` is not installed (``pip install "kgrad[mlflow]"``).

    Example (a local store, no server):

    >>> import os, tempfile, keras, kgrad, mlflow, numpy as np
    >>> os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 asks before using a local folder
    >>> mlflow.set_tracking_uri("file:" + os.path.join(tempfile.mkdtemp(), "mlruns"))
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> with mlflow.start_run() as run:
    ...     probe = kgrad.GradientProbe(tempfile.mkdtemp(), every_n_steps=2, sinks=[kgrad.MlflowSink()])
    ...     _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=2, callbacks=[probe], verbose=0)
    >>> client = mlflow.MlflowClient()
    >>> [metric.step for metric in client.get_metric_history(run.info.run_id, "kgrad/grad_norm/out")]
    [0, 2]
    >>> [artifact.path for artifact in client.list_artifacts(run.info.run_id, "kgrad")]
    ['kgrad/histograms', 'kgrad/report.html']
    """

    def __init__(self, run_id=None, prefix="kgrad", histograms=True, report=True, queue_size=100,
                 close_timeout=30.0):
        super().__init__("mlflow", "mlflow", prefix, histograms, report, queue_size, close_timeout)
        self._mlflow = self.tracker
        self.run_id = check_optional(
            "run_id", run_id, str, "an MLflow run id (str)", "kgrad.MlflowSink(run_id=run.info.run_id)"
        )
        self._client = None
        self._run_id = None

    def open(self):
        # MLflow keeps the active run per thread: it is looked up here, on the training thread.
        active = self._mlflow.active_run()
        self._run_id = self.run_id or (active.info.run_id if active is not None else None)
        if self._run_id is None:
            raise ValueError(
                "kgrad.MlflowSink found no active MLflow run. Call fit inside `with mlflow.start_run():`, "
                "or pass MlflowSink(run_id=...)."
            )
        self._client = self._mlflow.MlflowClient(tracking_uri=self._mlflow.get_tracking_uri())

    def write_record(self, record):
        prefix = tag_prefix(self.prefix, record)
        self._log_metrics({f"{prefix}/{tag}": value for tag, value in record.scalars.items()}, record.step)
        if self.histograms and record.histograms:
            histograms = {}
            for tag, buckets in record.histograms.items():
                counts, edges = counts_and_edges(buckets)
                histograms[tag] = {"edges": edges.tolist(), "counts": counts.tolist()}
            path = f"{prefix}/histograms/step_{record.step:09d}.json"
            self._client.log_dict(self._run_id, histograms, path)

    def _log_metrics(self, values, step):
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        metrics = [Metric(key, float(value), timestamp, int(step)) for key, value in values.items()]
        for start in range(0, len(metrics), _METRICS_PER_BATCH):
            self._client.log_batch(self._run_id, metrics=metrics[start : start + _METRICS_PER_BATCH])

    def write_guard_report(self, step, fields):
        self._log_metrics({f"{self.prefix}/guard/nan_count": fields["nan_count"],
                           f"{self.prefix}/guard/inf_count": fields["inf_count"]}, step)
        self._client.log_dict(self._run_id, fields, f"{self.prefix}/guard_report_step_{step}.json")
        self._client.set_tag(self._run_id, f"{self.prefix}.guard", fields["message"].splitlines()[0][:500])

    def attach_html_report(self, html_text, step, label):
        name = "report.html" if label == "end_of_fit" else f"report_{label}_step_{step}.html"
        self._client.log_text(self._run_id, html_text, f"{self.prefix}/{name}")

    def close(self):
        self._client = None
