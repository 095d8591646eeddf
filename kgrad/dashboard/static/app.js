// The kgrad view: controls, a shared legend, one column per run (heatmap,
// health table, NaN/Inf timeline) and the histograms of a clicked layer.
// `source` answers runs(), heatmap(run, quantity), summary(run) and
// histogram(run, tag) with promises: HTTP in TensorBoard, embedded JSON in
// the HTML report.
import { el, sharedScale, formatNumber } from "./common.js";
import { heatmapView, legendView } from "./heatmap.js";
import { healthTable, timelineView, histogramView } from "./panels.js";

const MAX_SIDE_BY_SIDE = 4;

function controls(state, onChange) {
  const select = el("select", { class: "quantity", "data-role": "quantity" });
  for (const quantity of state.quantities) {
    select.append(el("option", { value: quantity.key, text: quantity.label, selected: quantity.key === state.quantity }));
  }
  select.addEventListener("change", () => {
    state.quantity = select.value;
    onChange();
  });
  const runs = el("span", { class: "run-choices" });
  for (const run of state.runs) {
    const box = el("input", { type: "checkbox", checked: state.shown.includes(run), "data-run": run });
    box.addEventListener("change", () => {
      state.shown = state.runs.filter((name) => (name === run ? box.checked : state.shown.includes(name)));
      onChange();
    });
    runs.append(el("label", { class: "run-choice" }, [box, el("span", { text: run })]));
  }
  return el("div", { class: "controls" }, [el("label", { text: "Colour: " }, select), runs]);
}

function tooltip() {
  const tip = el("div", { class: "tooltip", role: "tooltip" });
  tip.hidden = true;
  return tip;
}

function showTip(tip, cell, event, label) {
  if (!cell) {
    tip.hidden = true;
    return;
  }
  tip.hidden = false;
  tip.dataset.run = cell.run;
  tip.dataset.layer = cell.layer;
  tip.dataset.step = String(cell.step);
  tip.dataset.value = Number.isNaN(cell.value) ? "" : String(cell.value);
  const lines = [
    el("div", { class: "tip-layer", text: cell.layer }),
    el("div", { class: "tip-step", text: `step ${cell.step}` }),
    el("div", { class: "tip-value", text: `${label} = ${Number.isNaN(cell.value) ? "not logged" : formatNumber(cell.value, 4)}` }),
  ];
  if (cell.flags.length) lines.push(el("div", { class: "tip-flags", text: cell.flags.join(", ") }));
  tip.replaceChildren(...lines);
  // Beside the cursor, on the side where it fits: near the right edge of the
  // page a fixed box would otherwise be squeezed and wrap the value.
  tip.style.left = "0px";  // measured where nothing squeezes it
  tip.style.top = "0px";
  const box = tip.getBoundingClientRect();
  const right = event.clientX + 14 + box.width <= window.innerWidth;
  const below = event.clientY + 14 + box.height <= window.innerHeight;
  tip.style.left = `${Math.max(0, right ? event.clientX + 14 : event.clientX - 14 - box.width)}px`;
  tip.style.top = `${Math.max(0, below ? event.clientY + 14 : event.clientY - 14 - box.height)}px`;
}

async function showHistograms(state, detail, cell) {
  detail.replaceChildren(el("p", { text: `Loading the histograms of ${cell.layer}…` }));
  const wanted = [];
  for (const run of state.shown) {
    const heatmap = state.heatmaps[run];
    const row = heatmap ? heatmap.layers.indexOf(cell.layer) : -1;
    // The first tag of the row (a layer's kernel, not its bias): one per run, side by side.
    if (row >= 0 && heatmap.histogram_tags[row].length) wanted.push([run, heatmap.histogram_tags[row][0]]);
  }
  const histograms = await Promise.all(wanted.map(([run, tag]) => state.source.histogram(run, tag)));
  if (!histograms.length) {
    detail.replaceChildren(el("p", { text: `No histograms were logged for ${cell.layer}.` }));
    return;
  }
  // One x-axis for every layer of these runs: small gradients look small.
  const low = Math.min(...histograms.map((h) => h.range[0]));
  const high = Math.max(...histograms.map((h) => h.range[1]));
  const width = Math.min(520, (detail.clientWidth || 900) / Math.min(histograms.length, 3) - 24);
  detail.replaceChildren(
    el("h3", { text: `Histograms of ${cell.layer} over steps` }),
    el("p", {
      class: "hint",
      text: `x-axis shared by every layer and run shown: ${formatNumber(low)} … ${formatNumber(high)}; colour: share of the step's values.`,
    }),
    el("div", { class: "histograms", "data-layer": cell.layer }, histograms.map((h) => histogramView(h, [low, high], width))),
  );
}

async function draw(state, body) {
  const started = performance.now();
  body.dataset.state = "loading";
  const shown = state.shown.slice(0, MAX_SIDE_BY_SIDE);
  const heatmaps = await Promise.all(shown.map((run) => state.source.heatmap(run, state.quantity)));
  const summaries = await Promise.all(shown.map((run) => state.source.summary(run)));
  state.heatmaps = Object.fromEntries(heatmaps.map((h) => [h.run, h]));
  const scale = sharedScale(heatmaps);
  const quantity = state.quantities.find((q) => q.key === state.quantity);
  const total = body.clientWidth || 1200;
  const width = Math.max(320, Math.floor(total / Math.max(1, shown.length)) - 24);
  const columns = heatmaps.map((heatmap, index) =>
    el("section", { class: "run-column", "data-run": heatmap.run }, [
      el("h2", { text: heatmap.run }),
      heatmapView(heatmap, scale, width, {
        hover: (cell, event) => showTip(state.tip, cell, event, quantity.label),
        click: (cell) => showHistograms(state, state.detail, cell),
      }),
      el("h3", { text: "Health (kgrad report)" }),
      el("div", { class: "table-wrap" }, healthTable(summaries[index])),
      el("h3", { text: "NaN / Inf" }),
      timelineView(summaries[index]),
    ]),
  );
  body.replaceChildren(
    legendView(scale, quantity.label, quantity.unit),
    el("p", {
      class: "hint",
      text: "Rows: layers in forward order (first layer on top). Columns: every probed step. " +
        "Hover a cell for its value; click it for that layer's histograms.",
    }),
    shown.length ? el("div", { class: "columns" }, columns) : el("p", { text: "Tick a run above." }),
  );
  body.dataset.state = "ready";
  body.dataset.renderMs = (performance.now() - started).toFixed(1);
}

// Builds the view in `root`; resolves when the first draw is done.
export async function startApp(root, source, title = "kgrad · gradient flow") {
  root.classList.add("kgrad");
  root.dataset.state = "loading";
  const info = await source.runs();
  if (!info.runs.length) {
    root.replaceChildren(
      el("h1", { text: title }),
      el("p", { class: "empty", text: "No kgrad runs in this log directory yet. Train with kgrad.GradientProbe(log_dir=...) " +
        "or run `kgrad demo`, and point TensorBoard at that folder." }),
    );
    root.dataset.state = "ready";
    return;
  }
  const state = {
    source,
    runs: info.runs,
    quantities: info.quantities,
    quantity: info.quantities[0].key,
    shown: info.runs.slice(0, MAX_SIDE_BY_SIDE),
    heatmaps: {},
    tip: tooltip(),
    detail: el("section", { class: "detail" }),
  };
  const body = el("div", { class: "body" });
  const redraw = () => draw(state, body).catch((error) => showError(body, error));
  root.replaceChildren(el("h1", { text: title }), controls(state, redraw), body, state.detail, state.tip);
  await redraw();
  root.dataset.state = "ready";
}

function showError(body, error) {
  body.dataset.state = "error";
  body.replaceChildren(el("p", { class: "error", text: `Could not draw: ${error.message || error}` }));
}
