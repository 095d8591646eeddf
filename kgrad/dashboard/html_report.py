"""``kgrad report LOG_DIR --html report.html``: the kgrad tab as one file.

One self-contained HTML file (no network: CSS, JavaScript and data inline)
with the kgrad tab's view of every kgrad run: the layer x step heatmaps,
the health tables, the NaN/Inf timeline and the histograms. The rendering
code is the tab's own (``kgrad/dashboard/static``), fed from embedded JSON
instead of HTTP; the health tables are also written as plain HTML, readable
without JavaScript and by a parser.

Everything that comes from the logs is escaped: text with `html.escape`,
the JSON with ``<``, ``>`` and ``&`` as ``\\u003c``..., so that a layer named
``</script><script>...`` stays data.
"""

import html
import json
import os
import re

from kgrad.dashboard import views
from kgrad.dashboard.events import read_run
from kgrad.logs.fast_reader import find_runs
from kgrad.report.health import is_kgrad_run
from kgrad.report.table import GRADIENT_NAMES, named_runs, nonfinite_cell

_STATIC = os.path.join(os.path.dirname(__file__), "static")
#: The tab's modules, in dependency order, inlined into one module script.
_MODULES = ("common.js", "heatmap.js", "panels.js", "histogram.js", "skipped.js", "stability.js", "app.js")
#: Histograms are left out past this many float32 values (about 4 bytes each, x1.33 in base64).
HISTOGRAM_BUDGET = 8_000_000

_BOOTSTRAP = """
const data = JSON.parse(document.getElementById("kgrad-data").textContent);
const found = (value, what) => {
  if (value === undefined) throw new Error(`${what} is not in this report`);
  return value;
};
document.getElementById("kgrad-static").hidden = true;
startApp(document.getElementById("kgrad-root"), {
  runs: async () => data.info,
  heatmap: async (run, quantity) => found(data.runs[run].heatmaps[quantity], quantity),
  summary: async (run) => data.runs[run].summary,
  histogram: async (run, tag) => found(data.runs[run].histograms[tag], `histogram ${tag}`),
  stability: async (run) => data.runs[run].stability,
}, data.title);
"""


def report_data(log_dir, thresholds=None):
    """What the HTML report embeds: every kgrad run's views, as JSON-ready dicts.

    Args:
        log_dir: A TensorBoard log directory.
        thresholds: A `kgrad.HealthThresholds` (``None``: the defaults).

    Returns:
        ``{"info": {"runs", "quantities"}, "runs": {run: {"heatmaps", "summary",
        "histograms", "stability"}}, "title", "histograms_left_out"}``.
    """
    run_views = {}
    # A single run's folder is named by the folder, as `kgrad report` names it.
    for run, paths in named_runs(find_runs(os.fspath(log_dir)), log_dir).items():
        data = read_run(paths)
        if is_kgrad_run(data):
            run_views[run] = views.RunView(run, data, thresholds)
    budget = HISTOGRAM_BUDGET
    runs, left_out = {}, 0
    for run, view in run_views.items():
        heatmaps = {quantity: view.heatmap(quantity) for quantity in views.QUANTITIES}
        histograms = {}
        for heatmap in heatmaps.values():
            for tags in heatmap["histogram_tags"]:
                for tag in tags[:1]:  # the tab shows a row's first tag
                    if tag in histograms:
                        continue
                    size = _histogram_size(view.data["histograms"][tag])
                    if size > budget:
                        left_out += 1
                        continue
                    budget -= size
                    histograms[tag] = view.histogram(tag)
        runs[run] = {
            "heatmaps": heatmaps,
            "summary": view.summary(),
            "histograms": histograms,
            "stability": view.stability(),
        }
    quantities = [
        {"key": key, "label": label, "unit": unit, "scale": scale}
        for key, (label, unit, scale, _) in views.QUANTITIES.items()
    ]
    return {
        "title": f"kgrad report · {os.path.basename(os.path.abspath(log_dir))}",
        "info": {"runs": list(runs), "quantities": quantities},
        "runs": runs,
        "histograms_left_out": left_out,
    }


def _histogram_size(series):
    values = series.values
    return sum(v.size for v in values) if isinstance(values, list) else values.size


def script_json(value):
    """JSON that is safe inside ``<script>``: ``<``, ``>``, ``&`` as ``\\u003c`` etc.

    Example:

    >>> from kgrad.dashboard.html_report import script_json
    >>> script_json({"layer": "</script>"})
    '{"layer": "\\\\u003c/script\\\\u003e"}'
    """
    text = json.dumps(value, allow_nan=False, ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _inlined_modules():
    """The tab's ES modules as one module body: imports dropped, exports made local."""
    parts = []
    for name in _MODULES:
        with open(os.path.join(_STATIC, name), encoding="utf-8") as file:
            source = file.read()
        source = re.sub(r"^import .*?;\n", "", source, flags=re.MULTILINE)
        parts.append(re.sub(r"^export ", "", source, flags=re.MULTILINE))
    return "\n".join(parts)


def _static_tables(data):
    """The health tables as plain HTML (shown without JavaScript, read by parsers)."""
    out = []
    for run, content in data["runs"].items():
        summary = content["summary"]
        out.append(f'<h2>{html.escape(run)}</h2>\n<table class="health" data-run="{html.escape(run)}">')
        gradient = html.escape(GRADIENT_NAMES.get(summary.get("gradient"), "gradient norm"))
        header = f"<th>layer</th><th>{gradient}</th><th>zero act</th><th>NaN/Inf</th><th>flags</th>"
        out.append(f"<tr>{header}</tr>")
        for row in summary["health"]:
            flags = " ".join(row["flags"])
            cells = [
                html.escape(row["layer"]),
                _number(row["grad_norm"]),
                _number(row["zero_fraction"]),
                nonfinite_cell(row["nonfinite"], row["nonfinite_norms"]),
                html.escape(flags.upper() or "ok"),
            ]
            out.append(
                f'<tr data-layer="{html.escape(row["layer"])}" data-flags="{html.escape(flags)}" '
                f'data-grad-norm="{_number(row["grad_norm"], "r")}">'
                + "".join(f"<td>{cell}</td>" for cell in cells)
                + "</tr>"
            )
        out.append("</table>")
    return "\n".join(out)


def _number(value, spec=".3g"):
    if value is None:
        return "-"
    if isinstance(value, str):  # a logged NaN/Inf ("NaN", "Inf"), as `views` sends it
        return value
    return repr(float(value)) if spec == "r" else format(value, spec)


def render_html(data):
    """The report's HTML text from `report_data`'s dict."""
    with open(os.path.join(_STATIC, "style.css"), encoding="utf-8") as file:
        style = file.read()
    title = html.escape(data["title"])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f"<title>{title}</title>\n<style>\n{style}</style></head>\n<body>\n"
        '<div id="kgrad-root"></div>\n'
        f'<section id="kgrad-static" class="kgrad"><h1>{title}</h1>\n{_static_tables(data)}\n</section>\n'
        f'<script type="application/json" id="kgrad-data">{script_json(data)}</script>\n'
        f'<script type="module">\n{_inlined_modules()}\n{_BOOTSTRAP}</script>\n'
        "</body></html>\n"
    )


def write_html_report(log_dir, path, thresholds=None):
    """Writes the HTML report of the kgrad runs under ``log_dir`` to ``path``.

    Args:
        log_dir: A TensorBoard log directory with runs written by kgrad.
        path: The HTML file to write (its folder must exist).
        thresholds: A `kgrad.HealthThresholds` (``None``: the defaults).

    Returns:
        The number of kgrad runs in the report.

    Raises:
        ValueError: If ``log_dir`` holds no kgrad run.
        OSError: If ``path`` cannot be written.

    Example:

    >>> import kgrad, tempfile, os, tensorflow as tf
    >>> log_dir = tempfile.mkdtemp()
    >>> with tf.summary.create_file_writer(log_dir + "/kgrad").as_default():
    ...     _ = tf.summary.scalar("grad_norm/dense", 0.5, step=0)
    >>> kgrad.write_html_report(log_dir, os.path.join(log_dir, "report.html"))
    1
    """
    if not os.path.isdir(os.fspath(log_dir)):
        raise ValueError(f"`log_dir` must be a directory of TensorBoard logs. Received: log_dir={log_dir!r}.")
    data = report_data(log_dir, thresholds)
    if not data["runs"]:
        raise ValueError(
            f"No kgrad run under log_dir={log_dir!r}. Train with kgrad.GradientProbe(log_dir=...) first."
        )
    with open(path, "w", encoding="utf-8") as file:
        file.write(render_html(data))
    return len(data["runs"])
