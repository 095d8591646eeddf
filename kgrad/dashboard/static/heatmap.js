// The layer x step heatmap of one run, drawn on a <canvas>, and its legend.
import { decodeFloats, el, colorAt, scalePosition, MISSING_RGB, NONFINITE_RGB, ZERO_RGB, formatNumber, fitText, textWidth } from "./common.js";

export const LABEL_WIDTH = 150; // px of the row labels at the least: .row-labels in style.css

// px of the row labels of `names` in a column `width` px wide: the longest name whole
// where it fits in 45% of the column (at least LABEL_WIDTH); longer ones are shortened.
export function labelWidthFor(names, width) {
  const widest = Math.max(0, ...names.map((name) => textWidth(name))) + 14; // + padding, a gap
  return Math.round(Math.max(LABEL_WIDTH, Math.min(widest, 0.45 * width)));
}

function rowHeight(layers) {
  if (layers <= 24) return 22;
  return Math.max(3, Math.floor(540 / layers));
}

// Draws one pixel per (layer, step) cell, then scales it up without smoothing:
// 200 x 10 000 cells cost one ImageData fill, whatever the screen width.
function paint(canvas, heatmap, values, scale, width, height) {
  const layers = heatmap.layers.length;
  const steps = heatmap.steps.length;
  const cells = document.createElement("canvas");
  cells.width = Math.max(1, steps);
  cells.height = Math.max(1, layers);
  const context = cells.getContext("2d");
  const image = context.createImageData(cells.width, cells.height);
  const palette = Array.from({ length: 256 }, (_, k) => colorAt(k / 255));
  for (let i = 0; i < layers * steps; i++) {
    const t = scalePosition(scale, values[i]);
    let rgb = NONFINITE_RGB;
    if (Number.isNaN(t)) rgb = MISSING_RGB;
    else if (t === -Infinity) rgb = ZERO_RGB;
    else if (t !== Infinity) rgb = palette[Math.round(255 * Math.min(1, Math.max(0, t)))];
    image.data[4 * i] = rgb[0];
    image.data[4 * i + 1] = rgb[1];
    image.data[4 * i + 2] = rgb[2];
    image.data[4 * i + 3] = 255;
  }
  context.putImageData(image, 0, 0);
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const target = canvas.getContext("2d");
  target.imageSmoothingEnabled = false;
  target.drawImage(cells, 0, 0, canvas.width, canvas.height);
}

export function stepAxis(steps, width) {
  const axis = el("div", { class: "step-axis" });
  axis.style.width = `${width}px`;
  if (!steps.length) return axis;
  // As many ticks as fit with a gap between them (ticks sit on whole cells, so the
  // closest two are the rounded-down index gap apart): narrow, 5 ticks ran together.
  const labelPx = 7 * String(steps[steps.length - 1]).length + 16;
  let ticks = Math.min(5, steps.length);
  while (ticks > 1 && (Math.floor((steps.length - 1) / (ticks - 1)) * width) / steps.length < labelPx) ticks--;
  for (let k = 0; k < ticks; k++) {
    const index = ticks === 1 ? 0 : Math.round((k * (steps.length - 1)) / (ticks - 1));
    const tick = el("span", { class: "tick", text: String(steps[index]) });
    tick.style.left = `${((index + 0.5) / steps.length) * 100}%`;
    axis.append(tick);
  }
  axis.append(el("span", { class: "axis-title", text: "training step" }));
  return axis;
}

// The heatmap of one run. handlers: {hover(info | null, event), click(info) or null};
// a click on a cell or on a row's label opens that layer. labelWidth: px of the labels.
export function heatmapView(heatmap, scale, width, handlers, labelWidth = labelWidthFor(heatmap.layers, width)) {
  const values = decodeFloats(heatmap.values);
  const layers = heatmap.layers.length;
  const steps = heatmap.steps.length;
  const height = rowHeight(layers) * Math.max(1, layers);
  const plotWidth = Math.max(120, width - labelWidth);
  // Rows thinner than a line of text: every few rows a label, drawn at full
  // size over its neighbours' (empty) rows rather than clipped to its own.
  const labels = el("div", { class: "row-labels" + (rowHeight(layers) < 12 ? " dense" : "") });
  labels.style.height = `${height}px`;
  labels.style.width = `${labelWidth}px`;
  const every = Math.max(1, Math.ceil(12 / rowHeight(layers)));
  heatmap.layers.forEach((layer, index) => {
    const flags = heatmap.flags[index];
    const label = el("div", {
      class: "row-label" + (flags.length ? " flagged" : "") + (index % every ? " hidden-text" : ""),
      "data-layer": layer,
      "data-row": index,
      "data-flags": flags.join(" "),
      title: flags.length ? `${layer}: ${flags.join(", ")}` : layer,
    });
    label.style.height = `${height / layers}px`;
    const badge = flags.length && rowHeight(layers) >= 12 ? el("span", { class: "badge", text: flags.join(" ") }) : null;
    // Room left of the badge (9 px capitals, ~7 px a letter) and the padding.
    const room = labelWidth - 10 - (badge ? 7 * badge.textContent.length + 10 : 0);
    const name = el("span", { class: "name", text: fitText(layer, room) });
    name.style.maxWidth = `${labelWidth - 6}px`;
    label.append(name);
    if (badge) label.append(badge);
    if (handlers.click) {
      // The label opens its layer as its cells do (by keyboard too).
      label.classList.add("clickable");
      label.tabIndex = 0;
      label.setAttribute("role", "button");
      const open = () => handlers.click({ run: heatmap.run, row: index, layer, flags, histogramTags: heatmap.histogram_tags[index] });
      label.addEventListener("click", open);
      label.addEventListener("keydown", (event) => {
        if (event.key !== "Enter" && event.key !== " ") return;
        event.preventDefault();
        open();
      });
    }
    labels.append(label);
  });
  const canvas = el("canvas", { class: "heatmap-canvas", "data-run": heatmap.run });
  canvas.dataset.layers = String(layers);
  canvas.dataset.steps = String(steps);
  const started = performance.now();
  paint(canvas, heatmap, values, scale, plotWidth, height);
  canvas.dataset.renderMs = (performance.now() - started).toFixed(1);
  const cellAt = (event) => {
    const box = canvas.getBoundingClientRect();
    const row = Math.floor(((event.clientY - box.top) / box.height) * layers);
    const column = Math.floor(((event.clientX - box.left) / box.width) * steps);
    if (row < 0 || row >= layers || column < 0 || column >= steps) return null;
    return {
      run: heatmap.run,
      row,
      layer: heatmap.layers[row],
      step: heatmap.steps[column],
      value: values[row * steps + column],
      flags: heatmap.flags[row],
      histogramTags: heatmap.histogram_tags[row],
    };
  };
  canvas.addEventListener("mousemove", (event) => handlers.hover(cellAt(event), event));
  canvas.addEventListener("mouseleave", (event) => handlers.hover(null, event));
  canvas.addEventListener("click", (event) => {
    const cell = cellAt(event);
    if (cell && handlers.click) handlers.click(cell);
  });
  const body = el("div", { class: "heatmap-body" }, [labels, canvas]);
  const axis = stepAxis(heatmap.steps, plotWidth);
  axis.style.marginLeft = `${labelWidth}px`;
  return el("div", { class: "heatmap", "data-label-width": labelWidth }, [body, axis]);
}

// The colour legend in real units, shared by every heatmap on the page.
export function legendView(scale, label, unit) {
  const bar = document.createElement("canvas");
  bar.width = 256;
  bar.height = 1;
  const context = bar.getContext("2d");
  for (let x = 0; x < 256; x++) {
    const [r, g, b] = colorAt(x / 255);
    context.fillStyle = `rgb(${r},${g},${b})`;
    context.fillRect(x, 0, 1, 1);
  }
  bar.className = "legend-bar";
  const ticks = el("div", { class: "legend-ticks" });
  const count = scale.scale === "log" ? scale.high - scale.low : 4;
  const step = Math.max(1, Math.ceil(count / 8));
  for (let k = 0; k <= count; k += step) {
    const value = scale.scale === "log" ? 10 ** (scale.low + k) : scale.low + (k * (scale.high - scale.low)) / count;
    const text = scale.scale === "log" ? (value >= 0.01 && value <= 100 ? String(value) : `1e${scale.low + k}`) : formatNumber(value, 2);
    const tick = el("span", { class: "tick", text });
    tick.style.left = `${(k / count) * 100}%`;
    ticks.append(tick);
  }
  const missing = el("span", { class: "missing-key", text: "not logged" });
  const nonfinite = el("span", { class: "nonfinite-key", text: "NaN/Inf" });
  // Only a log scale has no place for 0; on a linear one 0 is on the bar.
  const zero = scale.scale === "log" ? el("span", { class: "zero-key", text: "0" }) : null;
  const title = `${label}: ${unit}` + (scale.scale === "log" ? " (log scale)" : "");
  return el("div", { class: "legend", "data-low": scale.low, "data-high": scale.high }, [
    el("div", { class: "legend-title", text: title }),
    el("div", { class: "legend-scale" }, [bar, ticks]),
    zero,
    missing,
    nonfinite,
  ]);
}
