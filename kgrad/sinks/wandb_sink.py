"""`WandbSink`: kgrad's records in a Weights & Biases run (``pip install "kgrad[wandb]"``)."""

import html

from kgrad.sinks.base import TrackerSink, check_optional, counts_and_edges, tag_prefix


class WandbSink(TrackerSink):
    """Logs kgrad's records to a W&B run: scalars, histograms, the guard's report, the HTML report.

    Each probed step is one ``run.log`` call: every tag under ``prefix``
    (``kgrad/grad_norm/dense``; a `kgrad.ProbeTape`'s tags under
    ``kgrad/<tape>/``), histograms as ``wandb.Histogram(np_histogram=(counts,
    edges))`` with kgrad's own buckets, and the step, ``optimizer.iterations``
    as in TensorBoard, as ``kgrad/step``, the x-axis of every ``kgrad/*``
    chart (``run.define_metric``). That is how W&B's own Keras callback logs:
    W&B's global step belongs to the run (your callbacks advance it), and W&B
    drops a row logged at a step below it. A tripped `kgrad.NonFiniteGuard`
    logs ``kgrad/guard/report`` (its message), ``kgrad/guard/nan_count`` and
    ``inf_count`` at its step, and the report's fields in the run's summary
    (``kgrad/guard_report``). The HTML report (``kgrad report --html``) is
    logged as ``kgrad/report`` (``wandb.Html``) at the end of ``fit`` and on
    a trip: the gradient-flow heatmaps one click from the run page.

    Args:
        run: The ``wandb`` run to log to; ``None``: the active run
            (``wandb.run``) when ``fit`` starts.
        init: If there is no active run, the keyword arguments of the
            ``wandb.init`` that starts one (``{}`` for W&B's defaults); that
            run is finished at the end of ``fit``. ``None`` (default): no
            run is started, and ``fit`` stops at once if none is active.
        prefix: The section of the run's charts kgrad's tags go to.
        histograms: Whether histograms are logged (``wandb.Histogram``, in the
            row of their step).
        report: Whether the HTML report is logged (``wandb.Html``; it needs the
            callback's ``log_dir``: the report is read from its event files).
        queue_size: See `kgrad.Sink`.
        close_timeout: See `kgrad.Sink`.

    Raises:
        ImportError: If ``wandb`` is not installed (``pip install "kgrad[wandb]"``).

    Example (W&B offline, so that it runs anywhere):

    >>> import os, tempfile, keras, kgrad, numpy as np, wandb
    >>> run = wandb.init(mode="offline", dir=tempfile.mkdtemp(), project="kgrad-doc")
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> sink = kgrad.WandbSink()
    >>> probe = kgrad.GradientProbe(tempfile.mkdtemp(), every_n_steps=2, sinks=[sink])
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=2, callbacks=[probe], verbose=0)
    >>> sink.delivered, sink.dropped  # two probed steps and the HTML report
    (3, 0)
    >>> run.finish()
    """

    def __init__(self, run=None, init=None, prefix="kgrad", histograms=True, report=True,
                 queue_size=100, close_timeout=30.0):
        super().__init__("wandb", "wandb", prefix, histograms, report, queue_size, close_timeout)
        self._wandb = self.tracker
        self.run = run
        self.init = check_optional(
            "init", init, dict, "a dict of wandb.init keyword arguments",
            "kgrad.WandbSink(init={'project': 'my-project'})",
        )
        self._run = None
        self._started = False

    def open(self):
        self._run = self.run if self.run is not None else self._wandb.run
        self._started = False
        if self._run is None:
            if self.init is None:
                raise ValueError(
                    "kgrad.WandbSink found no active W&B run. Call wandb.init(...) before fit, pass "
                    "WandbSink(run=run), or let kgrad start one: WandbSink(init={'project': 'my-project'})."
                )
            self._run = self._wandb.init(**self.init)
            self._started = True
        step = f"{self.prefix}/step"
        self._run.define_metric(step)
        self._run.define_metric(f"{self.prefix}/*", step_metric=step)

    def write_record(self, record):
        prefix = tag_prefix(self.prefix, record)
        row = {f"{self.prefix}/step": record.step}
        row.update((f"{prefix}/{tag}", value) for tag, value in record.scalars.items())
        if self.histograms:
            for tag, buckets in record.histograms.items():
                row[f"{prefix}/{tag}"] = self._wandb.Histogram(np_histogram=counts_and_edges(buckets))
        self._run.log(row)

    def write_guard_report(self, step, fields):
        self._run.log({
            f"{self.prefix}/step": step,
            f"{self.prefix}/guard/report": self._wandb.Html(f"<pre>{html.escape(fields['message'])}</pre>"),
            f"{self.prefix}/guard/nan_count": fields["nan_count"],
            f"{self.prefix}/guard/inf_count": fields["inf_count"],
        })
        self._run.summary[f"{self.prefix}/guard_report"] = fields

    def attach_html_report(self, html_text, step, label):
        page = self._wandb.Html(html_text, inject=False, data_is_not_path=True)
        self._run.log({f"{self.prefix}/step": step, f"{self.prefix}/report": page})

    def close(self):
        if self._started:
            self._run.finish()
        self._run = None
