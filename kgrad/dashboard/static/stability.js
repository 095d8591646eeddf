// The stability view of one run, on one step axis: adam_rms per layer (a heatmap),
// the largest logit per output and attention score per attention layer (lines), the
// loss, and the spikes `kgrad report` marks; under it each loss spike with what spiked
// first. Every spike comes from the server (kgrad/report/stability.py): the rule is
// not written again here.
import { el, formatNumber } from "./common.js";
import { heatmapView, legendView, stepAxis, labelWidthFor } from "./heatmap.js";
import { skippedList, skippedMarks } from "./skipped.js";

const CHART_PX = 84; // px height of a line chart
const CHART_PAD = 7; // px above and below the lines: a spike's ring stays inside
const LOG_SPAN = 100; // highest / lowest value from which a chart's y-axis is logarithmic
const TIE_SHOWN = 4; // leaders of a tie named at once; the others behind "and N more"
// Tableau's categorical colours (the lines of one chart), then again.
const LINE_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"];
const HINT = 'No stability signals logged: GradientProbe(..., instruments=["optimizer", "logits", "attention"]) logs them.';
const CHARTS = [
  ["logits", "max logit", "largest logit per output (logit_max_max)"],
  ["attention", "attention max", "largest attention score per layer: max over its heads of attention_logit_max"],
  ["loss", "loss", "global/loss"],
];

const xOf = (column, steps, width) => ((column + 0.5) / steps) * width;

function aggregateText(rms) {
  return rms.aggregate === "rms"
    ? "RMS of g/(√v̂+ε) over the elements of the layer's logged weights"
    : "max over the layer's logged weights (the logs hold no weight shapes, so no RMS)";
}

// The adam_rms heatmap (the tab's heatmap, without its own axis) with a ring on every
// cell whose layer spiked there; `leaders`: "layer@step" of what moved first.
function rmsTrack(view, scale, width, labelWidth, handlers, leaders) {
  const { rms } = view;
  const matrix = {
    ...rms,
    run: view.run,
    flags: rms.layers.map(() => []),
    histogram_tags: rms.layers.map(() => []),
  };
  const node = heatmapView(matrix, scale, width, { hover: handlers.hover, click: null }, labelWidth);
  node.classList.add("stability-heatmap");
  node.querySelector(".step-axis").remove(); // one axis for the whole view, at its foot
  const canvas = node.querySelector("canvas");
  canvas.className = "stability-canvas";
  const cells = el("div", { class: "stability-cells" });
  canvas.replaceWith(cells);
  cells.append(canvas);
  const rowPx = parseFloat(canvas.style.height) / Math.max(1, rms.layers.length);
  const cellPx = parseFloat(canvas.style.width) / Math.max(1, rms.steps.length);
  for (const [row, column, step, tag] of rms.spikes) {
    const layer = rms.layers[row];
    const leader = leaders.has(`adam_rms ${layer}@${step}`);
    const ring = el("span", {
      class: "spike-cell" + (leader ? " leader" : ""),
      "data-layer": layer,
      "data-step": step,
      "data-row": row,
      "data-column": column,
      title: `${tag}: spike at step ${step}` + (leader ? " (moved before a loss spike)" : ""),
    });
    const size = Math.max(10, cellPx);
    ring.style.left = `${xOf(column, rms.steps.length, parseFloat(canvas.style.width)) - size / 2}px`;
    ring.style.width = `${size}px`;
    ring.style.top = `${row * rowPx}px`;
    ring.style.height = `${Math.max(4, rowPx)}px`;
    cells.append(ring);
  }
  return node;
}

// A path through a line's logged values; a gap where it was not logged. "l0 0" makes a
// lone point a dot (round caps).
function linePath(values, x, y) {
  let path = "";
  let drawing = false;
  values.forEach((value, column) => {
    if (value === null) {
      drawing = false;
      return;
    }
    path += `${drawing ? "L" : "M"}${x(column).toFixed(1)} ${y(value).toFixed(1)}${drawing ? "" : "l0 0"}`;
    drawing = true;
  });
  return path;
}

// SVG's namespace, as the HTML parser gives it to a constant <svg> (the HTML report holds
// no address, not even a namespace's).
const SVG_NAMESPACE = (() => {
  const holder = document.createElement("div");
  holder.innerHTML = "<svg></svg>";
  return holder.firstChild.namespaceURI;
})();

function svgNode(tag, attributes) {
  const node = document.createElementNS(SVG_NAMESPACE, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
  return node;
}

// One chart of lines on a y-axis from the lowest to the highest logged value: logarithmic
// where the values span LOG_SPAN or more (attention scores from 0.04 to 2390: on a linear
// axis the first spikes, at 51σ, lay flat on the floor), else linear. With values <= 0 too,
// sign(v)·log10(1 + |v|): log-like beyond ±1, linear near 0 (scores are O(1) numbers).
function lineTrack(view, part, title, what, width, labelWidth, leaders) {
  const lines = view[part];
  const steps = view.steps.length;
  const finite = lines.flatMap((line) => line.values.filter((v) => v !== null));
  let low = finite.length ? Math.min(...finite) : 0;
  let high = finite.length ? Math.max(...finite) : 1;
  if (high === low) [low, high] = [low - 0.5, high + 0.5];
  const positive = low > 0;
  const log = Math.max(Math.abs(low), Math.abs(high)) / (positive ? low : 1) >= LOG_SPAN;
  const symmetricLog = (value) => Math.sign(value) * Math.log10(1 + Math.abs(value));
  const axis = !log ? (value) => value : positive ? Math.log10 : symmetricLog;
  const x = (column) => xOf(column, steps, width);
  const y = (value) => CHART_PAD + (1 - (axis(value) - axis(low)) / (axis(high) - axis(low))) * (CHART_PX - 2 * CHART_PAD);
  const svg = svgNode("svg", { class: "chart", width, height: CHART_PX, "data-part": part, "data-scale": !log ? "linear" : positive ? "log" : "symlog" });
  svg.style.width = `${width}px`;
  svg.style.height = `${CHART_PX}px`;
  lines.forEach((line, index) => {
    const colour = LINE_COLOURS[index % LINE_COLOURS.length];
    const path = svgNode("path", { d: linePath(line.values, x, y), stroke: colour, class: "line", "data-name": line.name });
    path.append(svgNode("title", {}));
    path.firstChild.textContent = `${line.name} (${line.tags.join(", ")})`;
    svg.append(path);
    for (const column of line.nonfinite) {
      const mark = svgNode("rect", { class: "nonfinite-mark", x: x(column) - 2, y: 0, width: 4, height: 6, "data-step": view.steps[column] });
      svg.append(mark);
    }
    line.spikes.forEach((column, k) => {
      const step = line.spike_steps[k];
      const value = line.values[column];
      const leader = leaders.has(`${line.signal} ${line.name}@${step}`);
      const ring = svgNode("circle", {
        class: "spike-mark" + (leader ? " leader" : ""),
        cx: x(column),
        cy: value === null ? CHART_PAD : y(value), // a NaN/Inf spike: at the top
        r: leader ? 5 : 4,
        "data-step": step,
        "data-line": line.name,
        "data-part": part,
      });
      ring.append(svgNode("title", {}));
      ring.firstChild.textContent = `${line.name}: spike at step ${step}` + (value === null ? " (NaN/Inf)" : `: ${formatNumber(value, 4)}`);
      svg.append(ring);
    });
  });
  const label = el("div", { class: "chart-label", title: what }, [
    el("span", { class: "chart-high", text: formatNumber(high) }),
    el("span", { class: "chart-title", text: log ? `${title} (log)` : title }),
    el("span", { class: "chart-low", text: formatNumber(low) }),
  ]);
  label.style.height = `${CHART_PX}px`;
  label.style.width = `${labelWidth}px`;
  const keys = el(
    "div",
    { class: "chart-keys" },
    lines.map((line, index) => {
      const swatch = el("span", { class: "swatch" });
      swatch.style.background = LINE_COLOURS[index % LINE_COLOURS.length];
      const heads = part === "attention" ? ` (${line.tags.length} head${line.tags.length === 1 ? "" : "s"})` : "";
      return el("span", { class: "chart-key", "data-name": line.name, title: line.tags.join(", ") }, [swatch, el("span", { text: line.name + heads })]);
    }),
  );
  keys.style.marginLeft = `${labelWidth}px`;
  return el("div", { class: "chart-track", "data-part": part }, [el("div", { class: "chart-row" }, [label, svg]), keys]);
}

function aheadText(probes) {
  return probes === 0 ? "same probe" : `${probes} probe${probes === 1 ? "" : "s"} ahead`;
}

// The leaders of a loss spike grouped by their step: signals that spiked at one probe are
// a tie (which moved first is not known), not a chain of causes.
function ties(leaders) {
  const groups = [];
  for (const lead of leaders) {
    const last = groups[groups.length - 1];
    if (last && last[0].step === lead.step) last.push(lead);
    else groups.push([lead]);
  }
  return groups;
}

// A signal with its size: σ above the mean of its previous probes (a tie is said with sizes, not an order).
function leadChip(lead) {
  // As kgrad report words it (report/stability_words.py): whole σ from 10 on, else 2 digits.
  const sigmas = typeof lead.sigmas === "number" ? (Math.abs(lead.sigmas) >= 10 ? Math.round(lead.sigmas) : Number(lead.sigmas.toPrecision(2))) : null;
  const size = sigmas === null ? " (NaN/Inf or σ 0)" : ` (${sigmas}σ)`;
  return el("span", { class: "lead", "data-layer": lead.layer, "data-signal": lead.signal, "data-step": lead.step, "data-sigmas": lead.sigmas, text: `${lead.layer} ${lead.signal}${size}` });
}

// One tie: "at step 51 (1 probe ahead), 22 at once:" and its first few signals, largest
// first, each with its size; the others folded under "and 18 more".
function tieView(tie) {
  const { step, probes_ahead: ahead } = tie[0];
  const head = `at step ${step} (${aheadText(ahead)})` + (tie.length > 1 ? `, ${tie.length} at once: ` : ": ");
  const parts = [el("span", { class: "tie-head", text: head }), ...tie.slice(0, TIE_SHOWN).map(leadChip)];
  if (tie.length > TIE_SHOWN) {
    parts.push(el("details", { class: "tie-more" }, [
      el("summary", { text: `and ${tie.length - TIE_SHOWN} more` }),
      ...tie.slice(TIE_SHOWN).map(leadChip),
    ]));
  }
  return el("span", { class: "tie", "data-step": step, "data-size": tie.length }, parts);
}

// Each loss spike on one line: its step and value, then what spiked first, tie by tie, earliest first.
function lossSpikeList(view) {
  if (!view.loss) return null;
  if (!view.loss_spikes.length) {
    return el("p", { class: "hint loss-spikes none", text: `No loss spike (${view.rule}).` });
  }
  const items = view.loss_spikes.map((spike) => {
    const value = typeof spike.value === "string" ? spike.value : formatNumber(spike.value);
    const parts = [el("strong", { text: `step ${spike.step}` }), el("span", { text: ` loss ${value} (mean ${formatNumber(spike.mean)} ± ${formatNumber(spike.std)}) ` })];
    if (spike.leaders.length) {
      parts.push(el("span", { class: "first", text: "first: " }));
      ties(spike.leaders).forEach((tie, index) => {
        if (index) parts.push(el("span", { class: "tie-separator", text: "; " }));
        parts.push(tieView(tie));
      });
    } else {
      parts.push(el("span", { class: "first", text: `no layer signal spiked within ${view.window} probes before it` }));
    }
    return el("li", { "data-step": spike.step }, parts);
  });
  return el("div", { class: "loss-spikes" }, [
    el("div", { class: "loss-spikes-title", text: `Loss spikes (${view.rule}); what spiked first within ${view.window} probes before each:` }),
    el("ol", {}, items),
  ]);
}

// A dashed line down the whole view at each loss spike, labelled with its step where
// there is room beside the previous label.
function spikeLines(view, width, labelWidth, plot) {
  let lastLabel = -Infinity;
  for (const spike of view.loss_spikes) {
    const left = labelWidth + xOf(spike.column, view.steps.length, width);
    const line = el("span", { class: "loss-spike-line", "data-step": spike.step, title: `loss spike at step ${spike.step}` });
    line.style.left = `${left}px`;
    plot.append(line);
    if (left - lastLabel >= 56) {
      const label = el("span", { class: "loss-spike-label", text: `loss ↑ ${spike.step}` });
      label.style.left = `${left}px`;
      plot.append(label);
      lastLabel = left;
    }
  }
}

// The stability view of one run. scale: the adam_rms colour scale shared by the runs
// shown; handlers: {hover(cell | null, event)}.
export function stabilityView(view, scale, columnWidth, handlers) {
  const box = el("div", { class: "stability", "data-run": view.run });
  if (!view.rms && !view.logits && !view.attention) {
    box.append(el("p", { class: "hint stability-hint", text: HINT }), skippedList(view) || "");
    return box;
  }
  // Labels wide enough for the layer paths of a transformer (cut at 150 px, 16 of 19 read
  // "transformer_layer_0/self…"), the same for every track: one step axis.
  const labelWidth = labelWidthFor(view.rms ? view.rms.layers : [], columnWidth);
  const width = Math.max(120, columnWidth - labelWidth);
  const leaders = new Set(view.loss_spikes.flatMap((spike) => spike.leaders.map((lead) => `${lead.signal} ${lead.layer}@${lead.step}`)));
  const missing = view.missing.map((part) => `${part.what} (instruments=["${part.instrument}"])`);
  if (missing.length) box.append(el("p", { class: "hint stability-missing", text: `Not logged: ${missing.join(", ")}.` }));
  if (view.rms) {
    const legend = legendView(scale, "adam_rms per layer", aggregateText(view.rms));
    legend.classList.add("stability-legend");
    // End labels inside the bar's ends: centred on them they stuck out of a narrow column.
    const ticks = legend.querySelectorAll(".legend-ticks .tick");
    if (ticks.length > 1) {
      ticks[0].style.transform = "none";
      ticks[ticks.length - 1].style.transform = "translateX(-100%)";
    }
    box.append(legend);
  }
  const plot = el("div", { class: "stability-plot" });
  if (view.rms) plot.append(rmsTrack(view, scale, columnWidth, labelWidth, handlers, leaders));
  for (const [part, title, what] of CHARTS) {
    if (view[part]) plot.append(lineTrack(view, part, title, what, width, labelWidth, leaders));
  }
  spikeLines(view, width, labelWidth, plot);
  skippedMarks(view, width, labelWidth, plot);
  const axis = stepAxis(view.steps, width);
  axis.classList.add("stability-axis");
  axis.style.marginLeft = `${labelWidth}px`;
  box.append(
    plot,
    axis,
    el("p", { class: "hint", text: `Red rings: spikes (${view.rule}), as kgrad report marks them; orange: what spiked first before a loss spike (below)` + ((view.skipped || []).length ? "; purple bands: steps the guard skipped (below)." : ".") }),
    lossSpikeList(view),
    skippedList(view) || "",
  );
  return box;
}
