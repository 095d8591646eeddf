// The kgrad view: controls, a shared legend, one column per run (heatmap,
// health table, NaN/Inf timeline) and the histograms of a clicked layer.
// `source` answers runs(), heatmap(run, quantity), summary(run) and
// histogram(run, tag) with promises: HTTP in TensorBoard, embedded JSON in
// the HTML report. Data is fetched by `draw`; `layout` only lays out what was
// fetched, so that a resize redraws at once, without asking the server again.
import { el, sharedScale, formatNumber } from "./common.js";
import { heatmapView, legendView, LABEL_WIDTH } from "./heatmap.js";
import { flagSummary, healthTable, timelineView, showTip } from "./panels.js";
import { histogramAxis, histogramView } from "./histogram.js";
import { stabilityView } from "./stability.js";

const MAX_SIDE_BY_SIDE = 4;
const GAP = 24; // px between run columns: .columns' gap in style.css
const MIN_PLOT = 240; // px: the narrowest heatmap whose step ticks stay apart
// TensorBoard reloads its own tabs every 30 s; a run still training shows its new steps sooner here.
const POLL_MS = 10000;

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

// Scrolls the least that shows all of `node` (its top, when taller than the window):
// the histograms are drawn below every run, out of sight on a small screen.
function bringIntoView(node) {
  const box = node.getBoundingClientRect();
  if (box.top >= 0 && box.bottom <= window.innerHeight) return;
  node.scrollIntoView({ block: box.height > window.innerHeight ? "start" : "nearest" });
}

// The histograms of `layer` for the colour shown: the first tag of its row
// (a layer's kernel, not its bias), one per run, side by side.
async function showHistograms(state, layer, scroll) {
  const ticket = ++state.histogramTicket;
  state.selected = layer;
  if (scroll) {
    state.detail.replaceChildren(el("p", { text: `Loading the histograms of ${layer}…` }));
    bringIntoView(state.detail);
  }
  const wanted = [];
  for (const run of state.shown) {
    const heatmap = state.heatmaps[run];
    const row = heatmap ? heatmap.layers.indexOf(layer) : -1;
    if (row >= 0 && heatmap.histogram_tags[row].length) wanted.push([run, heatmap.histogram_tags[row][0]]);
  }
  const histograms = await Promise.all(wanted.map(([run, tag]) => state.source.histogram(run, tag)));
  if (ticket !== state.histogramTicket) return; // another click or colour came meanwhile
  state.histograms = { layer, list: histograms };
  layoutHistograms(state);
  if (scroll) bringIntoView(state.detail);
}

function layoutHistograms(state) {
  const { detail } = state;
  if (!state.histograms) return;
  const { layer, list } = state.histograms;
  if (!list.length) {
    detail.replaceChildren(el("p", { text: `No histograms were logged for ${layer}.` }));
    return;
  }
  // One x-axis per kind for every layer of these runs: small gradients look small.
  // Logs of earlier versions hold linear histograms, newer ones log-magnitude ones.
  const axes = {};
  for (const kind of new Set(list.map((h) => h.kind || "linear"))) {
    const ranges = list.filter((h) => (h.kind || "linear") === kind).map((h) => h.range);
    const outermost = list.find((h) => (h.kind || "linear") === kind).outermost;
    axes[kind] = histogramAxis(kind, [Math.min(...ranges.map((r) => r[0])), Math.max(...ranges.map((r) => r[1]))], outermost);
  }
  const perRow = Math.min(list.length, 3);
  // .histograms' gap is 20 px; a canvas has a 1 px border each side.
  const width = Math.min(520, Math.floor(((detail.clientWidth || 900) - 20 * (perRow - 1)) / perRow) - 2);
  const shared = Object.entries(axes).map(([kind, axis]) => (kind === "log" ? axis.describe : `${axis.describe} (linear)`));
  detail.replaceChildren(
    el("h3", { text: `Histograms of ${layer} over steps` }),
    el("p", {
      class: "hint",
      text: `x-axis shared by every layer and run shown: ${shared.join("; ")}; colour: share of the step's values.`,
    }),
    el("div", { class: "histograms", "data-layer": layer }, list.map((h) => histogramView(h, axes[h.kind || "linear"], width))),
  );
  detail.dataset.width = String(detail.clientWidth);
}

// Runs a row: as many as fit at `need` px each, the same number on every row
// (4 runs that fit 3 a row go 2 + 2, not 3 + 1).
function columnsPerRow(total, need, count) {
  const fit = Math.max(1, Math.min(count, Math.floor((total + GAP) / (need + GAP))));
  return Math.ceil(count / Math.ceil(count / fit));
}

// The width a run's column needs: its health table unclipped (a table is never
// narrower than its content, so in a 1 px box it takes its narrowest width).
function neededWidth(body, tables) {
  const probe = el("div", { class: "measure" }, tables);
  body.append(probe);
  const widest = Math.max(0, ...tables.map((table) => table.getBoundingClientRect().width));
  probe.remove();
  return Math.max(LABEL_WIDTH + MIN_PLOT, Math.ceil(widest) + 2);
}

// The tooltip after a redraw (a colour changed by keyboard, the live refresh) under a
// pointer that did not move: the value now under it, or none; never the old cell's.
function refreshTip(state) {
  if (state.tip.hidden) return;
  const target = state.pointer && document.elementFromPoint(...state.pointer);
  if (target && target.tagName === "CANVAS" && target.closest(".heatmap")) {
    const [clientX, clientY] = state.pointer;
    target.dispatchEvent(new MouseEvent("mousemove", { clientX, clientY, bubbles: true }));
  } else {
    state.tip.hidden = true;
  }
}

function layout(state, body) {
  const { heatmaps, summaries, stabilities } = state.loaded;
  const total = body.clientWidth || 1200;
  const tables = summaries.map(healthTable);
  const perRow = columnsPerRow(total, neededWidth(body, tables), Math.max(1, heatmaps.length));
  const width = Math.floor((total - GAP * (perRow - 1)) / perRow);
  const scale = sharedScale(heatmaps);
  const quantity = state.quantities.find((q) => q.key === state.quantity);
  // adam_rms on one colour scale for the runs side by side, as the heatmaps above.
  const stabilityScale = sharedScale(stabilities.filter((s) => s && s.rms).map((s) => s.rms));
  const columns = heatmaps.map((heatmap, index) =>
    el("section", { class: "run-column", "data-run": heatmap.run }, [
      el("h2", { text: heatmap.run }),
      heatmapView(heatmap, scale, width, {
        hover: (cell, event) => showTip(state.tip, cell, event, quantity.label),
        click: (cell) => showHistograms(state, cell.layer, true),
      }),
      el("h3", { text: "Health (kgrad report)" }),
      el("div", { class: "table-wrap" }, tables[index]),
      el("h3", { text: "NaN / Inf" }),
      timelineView(summaries[index]),
      stabilities[index] ? el("h3", { text: "Stability: adam_rms, max logits, attention, loss spikes" }) : null,
      stabilities[index]
        ? stabilityView(stabilities[index], stabilityScale, width, {
          hover: (cell, event) => showTip(state.tip, cell, event, "adam_rms"),
        })
        : null,
    ]),
  );
  const grid = el("div", { class: "columns", "data-per-row": perRow }, columns);
  grid.style.gridTemplateColumns = `repeat(${perRow}, minmax(0, 1fr))`;
  body.replaceChildren(
    heatmaps.length ? flagSummary(summaries) : null,
    legendView(scale, quantity.label, quantity.unit),
    el("p", {
      class: "hint",
      text: "Rows: layers in forward order (first layer on top). Columns: every probed step. " +
        "Hover a cell for its value; click it for that layer's histograms.",
    }),
    heatmaps.length ? grid : el("p", { text: "Tick a run above." }),
  );
  body.dataset.layoutWidth = String(total);
  refreshTip(state);
}

async function draw(state, body) {
  const ticket = ++state.drawTicket;
  const started = performance.now();
  body.dataset.state = "loading";
  const shown = state.shown.slice(0, MAX_SIDE_BY_SIDE);
  const heatmaps = await Promise.all(shown.map((run) => state.source.heatmap(run, state.quantity)));
  const summaries = await Promise.all(shown.map((run) => state.source.summary(run)));
  // Sources without the stability route (an older HTML report's data) draw without it.
  const stabilities = await Promise.all(shown.map((run) => (state.source.stability ? state.source.stability(run) : null)));
  if (ticket !== state.drawTicket) return; // a newer draw (another colour, new steps) is under way
  state.heatmaps = Object.fromEntries(heatmaps.map((h) => [h.run, h]));
  state.loaded = { heatmaps, summaries, stabilities };
  layout(state, body);
  body.dataset.state = "ready";
  body.dataset.renderMs = (performance.now() - started).toFixed(1);
  // The open histograms follow the colour (its histogram kind) and the new steps.
  if (state.selected) await showHistograms(state, state.selected, false);
}

// Lays out again when the page's width changes (a window resize, a panel opened
// beside TensorBoard): widths are computed from it, so CSS alone cannot.
function followWidth(state, body) {
  let timer = null;
  new ResizeObserver(() => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      if (!state.loaded || body.dataset.state !== "ready") return;
      if (String(body.clientWidth) !== body.dataset.layoutWidth) layout(state, body);
      if (String(state.detail.clientWidth) !== state.detail.dataset.width) layoutHistograms(state);
    }, 100);
  }).observe(body);
}

// Asks for the runs' revisions every POLL_MS and draws again when a shown run
// grew or the runs changed. Only sources that give revisions (TensorBoard's) change.
function followRuns(state, redraw, renewControls) {
  setInterval(async () => {
    if (document.hidden) return;
    let info;
    try {
      info = await state.source.runs();
    } catch (error) {
      return; // TensorBoard restarting: the next tick asks again
    }
    const revisions = info.revisions || {};
    const runsChanged = info.runs.join("\n") !== state.runs.join("\n");
    const grew = state.shown.some((run) => revisions[run] !== state.revisions[run]);
    if (!runsChanged && !grew) return;
    if (runsChanged) {
      const added = info.runs.filter((run) => !state.runs.includes(run));
      const kept = info.runs.filter((run) => state.shown.includes(run) || added.includes(run));
      state.shown = kept.slice(0, Math.max(MAX_SIDE_BY_SIDE, state.shown.length));
      state.runs = info.runs;
      renewControls();
    }
    state.revisions = revisions;
    await redraw();
  }, POLL_MS);
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
    revisions: info.revisions || {},
    quantities: info.quantities,
    quantity: info.quantities[0].key,
    shown: info.runs.slice(0, MAX_SIDE_BY_SIDE),
    heatmaps: {},
    loaded: null,
    selected: null, // the clicked layer, whose histograms are shown
    histograms: null,
    drawTicket: 0,
    histogramTicket: 0,
    pointer: null, // [clientX, clientY] of the pointer over the view
    tip: el("div", { class: "tooltip", role: "tooltip", hidden: true }),
    detail: el("section", { class: "detail" }),
  };
  const body = el("div", { class: "body" });
  // Where the pointer is, for the tooltip after a redraw under it (refreshTip).
  root.addEventListener("mousemove", (event) => { state.pointer = [event.clientX, event.clientY]; });
  root.addEventListener("mouseleave", () => { state.pointer = null; });
  const redraw = () => draw(state, body).catch((error) => showError(body, error));
  let bar = controls(state, redraw);
  root.replaceChildren(el("h1", { text: title }), bar, body, state.detail, state.tip);
  await redraw();
  followWidth(state, body);
  if (info.revisions) {
    followRuns(state, redraw, () => {
      const fresh = controls(state, redraw);
      bar.replaceWith(fresh);
      bar = fresh;
    });
  }
  root.dataset.state = "ready";
}

function showError(body, error) {
  body.dataset.state = "error";
  body.replaceChildren(el("p", { class: "error", text: `Could not draw: ${error.message || error}` }));
}
