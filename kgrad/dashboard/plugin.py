"""The kgrad tab of TensorBoard: a dynamic plugin found through an entry point.

``pip install kgrad`` registers `KgradPluginLoader` under the
``tensorboard_plugins`` entry point, so plain ``tensorboard --logdir DIR``
shows a "kgrad" tab. Its frontend is a plain ES module (``static/``) that
TensorBoard loads in an iframe; it asks these routes (under
``/data/plugin/kgrad/``) for data:

- ``runs``: the kgrad runs, each with a revision that changes when its event
  files do (the page polls it to show the steps of a run still training),
  and the heatmap quantities;
- ``heatmap?run=R&quantity=Q``: a layer x step matrix (`views.RunView.heatmap`);
- ``summary?run=R``: health table, NaN/Inf timeline, guard reports;
- ``histogram?run=R&tag=T``: one histogram tag over steps;
- ``stability?run=R``: adam_rms per layer, max logits, attention maxima and
  their spikes on one time axis (`views.RunView.stability`).

Safe to serve: a run or tag is looked up among those read from the log
directory, never joined into a path; anything unknown or malformed gets a
400/404 text answer naming the parameter.
"""

import itertools
import json
import os

from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from kgrad.dashboard import views
from kgrad.dashboard.events import LogCache
from kgrad.report.health import is_kgrad_run

PLUGIN_NAME = "kgrad"
_STATIC = os.path.join(os.path.dirname(__file__), "static")
#: Static files served by name; nothing else is read from disk on request.
_STATIC_FILES = {
    "index.js": "text/javascript",
    "app.js": "text/javascript",
    "common.js": "text/javascript",
    "heatmap.js": "text/javascript",
    "panels.js": "text/javascript",
    "histogram.js": "text/javascript",
    "stability.js": "text/javascript",
    "skipped.js": "text/javascript",
    "style.css": "text/css",
}
_MAX_PARAMETER = 1000  # characters; run names and tags are shorter


class _BadRequest(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class KgradPlugin(base_plugin.TBPlugin):
    """Serves the kgrad tab from the event files under ``context.logdir``.

    Args:
        context: TensorBoard's `base_plugin.TBContext`; only ``logdir`` is
            used (``context.multiplexer`` may be ``None``).
    """

    plugin_name = PLUGIN_NAME

    def __init__(self, context):
        super().__init__(context)
        self._cache = LogCache(context.logdir or "") if context.logdir else None
        self._views = {}  # run -> RunView of its current data
        self._revisions = {}  # run -> number of its current RunView, new whenever its data is
        self._counter = itertools.count(1)

    def get_plugin_apps(self):
        apps = {f"/{name}": self._static for name in _STATIC_FILES}
        apps.update(
            {
                "/runs": self._runs_route,
                "/heatmap": self._heatmap_route,
                "/summary": self._summary_route,
                "/histogram": self._histogram_route,
                "/stability": self._stability_route,
            }
        )
        return apps

    def is_active(self):
        # Listed whenever a log directory is given; the tab says when no run is kgrad's.
        return self._cache is not None

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="kgrad")

    def _run_views(self):
        """run -> `views.RunView` of every kgrad run; unchanged runs keep their views."""
        runs = self._cache.runs() if self._cache is not None else {}
        fresh = {}
        for run, data in runs.items():
            if not is_kgrad_run(data):
                continue
            known = self._views.get(run)
            if known is not None and known.data is data:
                fresh[run] = known
            else:  # new run, or its files changed: LogCache read it again
                fresh[run] = views.RunView(run, data)
                self._revisions[run] = next(self._counter)
        self._views = fresh
        return fresh

    @wrappers.Request.application
    def _static(self, request):
        name = request.path.rsplit("/", 1)[-1]
        if name not in _STATIC_FILES:  # cannot happen through the routes above
            return _text(request, 404, "Not found.")
        with open(os.path.join(_STATIC, name), "rb") as file:
            return _respond(request, 200, file.read(), _STATIC_FILES[name])

    @wrappers.Request.application
    def _runs_route(self, request):
        return self._answer(request, lambda: self._runs(request))

    @wrappers.Request.application
    def _heatmap_route(self, request):
        return self._answer(request, lambda: self._heatmap(request))

    @wrappers.Request.application
    def _summary_route(self, request):
        return self._answer(request, lambda: self._run(request, {"run"}).summary())

    @wrappers.Request.application
    def _stability_route(self, request):
        return self._answer(request, lambda: self._run(request, {"run"}).stability())

    @wrappers.Request.application
    def _histogram_route(self, request):
        return self._answer(request, lambda: self._histogram(request))

    def _answer(self, request, compute):
        try:
            payload = compute()
        except _BadRequest as error:
            return _text(request, error.code, str(error))
        body = json.dumps(payload, allow_nan=False, separators=(",", ":"))
        return _respond(request, 200, body, "application/json")

    def _runs(self, request):
        _parameters(request, set())
        runs = self._run_views()
        quantities = [
            {"key": key, "label": q[0], "unit": q[1], "scale": q[2]} for key, q in views.QUANTITIES.items()
        ]
        return {
            "runs": list(runs),
            "revisions": {run: self._revisions[run] for run in runs},
            "quantities": quantities,
            "logdir_has_runs": bool(runs),
        }

    def _run(self, request, allowed):
        arguments = _parameters(request, allowed)
        run = _required(arguments, "run")
        view = self._run_views().get(run)
        if view is None:
            raise _BadRequest(404, f"Unknown run: run={run!r}. Ask /data/plugin/kgrad/runs for the runs.")
        return view

    def _heatmap(self, request):
        view = self._run(request, {"run", "quantity"})
        quantity = _required(_parameters(request, {"run", "quantity"}), "quantity")
        if quantity not in views.QUANTITIES:
            raise _BadRequest(
                400, f"Unknown quantity: quantity={quantity!r}. Expected one of {list(views.QUANTITIES)}."
            )
        return view.heatmap(quantity)

    def _histogram(self, request):
        view = self._run(request, {"run", "tag"})
        tag = _required(_parameters(request, {"run", "tag"}), "tag")
        if tag not in view.data["histograms"]:
            raise _BadRequest(404, f"Unknown histogram tag in run {view.run!r}: tag={tag!r}.")
        return view.histogram(tag)


def _parameters(request, allowed):
    """The query parameters, each given once, all in ``allowed``, each short."""
    unknown = sorted(set(request.args) - allowed)
    if unknown:
        raise _BadRequest(
            400, f"Unknown parameter {unknown[0]!r}. This route takes: {sorted(allowed) or 'none'}."
        )
    arguments = {}
    for name in request.args:
        values = request.args.getlist(name)
        if len(values) != 1:
            raise _BadRequest(400, f"Parameter {name!r} must be given once. Received it {len(values)} times.")
        if len(values[0]) > _MAX_PARAMETER or "\x00" in values[0]:
            raise _BadRequest(400, f"Parameter {name!r} is malformed (too long or holds a NUL character).")
        arguments[name] = values[0]
    return arguments


def _required(arguments, name):
    if not arguments.get(name):
        raise _BadRequest(400, f"Missing parameter {name!r}: pass ?{name}=...")
    return arguments[name]


def _text(request, code, message):
    return _respond(request, code, message, "text/plain; charset=utf-8")


def _respond(request, code, body, content_type):
    from tensorboard.backend import http_util

    return http_util.Respond(request, body, content_type, code=code)


class KgradPluginLoader(base_plugin.TBLoader):
    """The ``tensorboard_plugins`` entry point: makes the kgrad tab's plugin."""

    def load(self, context):
        return KgradPlugin(context)
