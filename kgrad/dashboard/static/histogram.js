// The histogram view of a tag over steps: one row of pixels per step, x on a range shared
// by the tags of its kind. Linear histograms (equal buckets between a tensor's min and max)
// are drawn on a linear axis; log-magnitude ones (fixed buckets by sign and decade) on a
// symmetric log-magnitude axis: negative decades left of 0, positive right, the exact-zero
// bucket in the middle, the decades from the smallest to the largest magnitude logged.
import { decodeFloats, el, colorAt, formatNumber } from "./common.js";

// Width of the exact-zero bucket on a log-magnitude axis, in decades (half each side of 0).
const ZERO_DECADES = 0.5;
// The fewest pixels between two decade labels.
const LABEL_PX = 46;

// `position(v)` in [0, 1] across the panel and the axis labels, for a histogram's kind.
// `outermost`: a log-magnitude histogram's fixed end edges (1e-12, 1e4), whose buckets also
// hold every magnitude beyond them.
export function histogramAxis(kind, range, outermost) {
  if (kind === "log") return logMagnitudeAxis(range[0], range[1], outermost);
  const [low, high] = range;
  const span = high - low || 1;
  const zero = (0 - low) / span;
  return {
    position: (value) => (value - low) / span,
    labels: (width) => [
      { at: 0, text: formatNumber(low), side: "low" },
      low < 0 && high > 0 ? { at: zero, text: "0" } : null,
      { at: 1, text: formatNumber(high), side: "high" },
    ].filter(Boolean),
    zero,
    describe: `${formatNumber(low)} … ${formatNumber(high)}`,
  };
}

// Symmetric log-magnitude axis over magnitudes [smallest, largest] (bucket edges, > 0).
// Where the range reaches an end of the fixed edges (`outermost`), that end is open: the
// outermost bucket counts |v| ≥ its left edge however large (≥1e4 is labelled so), the
// innermost every non-zero |v| below its right edge, and the hint says so.
function logMagnitudeAxis(smallest, largest, outermost) {
  const openHigh = Boolean(outermost) && largest >= outermost[1] * (1 - 1e-6);
  const openLow = Boolean(outermost) && smallest <= outermost[0] * (1 + 1e-6);
  const bottom = Math.log10(smallest);
  const decades = Math.max(Math.log10(largest) - bottom, 0);
  const half = ZERO_DECADES / 2 + decades;
  // Decades from 0's side of the zero bucket; magnitudes below `smallest` (the zero
  // bucket's own edges, ±1e-12) sit on its border.
  const signed = (value) => {
    if (value === 0) return 0;
    const distance = ZERO_DECADES / 2 + Math.max(0, Math.log10(Math.abs(value)) - bottom);
    return Math.sign(value) * distance;
  };
  const position = (value) => (signed(value) + half) / (2 * half);
  const labels = (width) => {
    const perDecade = width / (2 * half);
    const stride = Math.max(1, Math.ceil(LABEL_PX / Math.max(perDecade, 1e-9)));
    const end = formatNumber(largest, 2);
    const out = [
      { at: 0, text: openHigh ? `≤−${end}` : `−${end}`, side: "low" },
      { at: 0.5, text: "0" },
      { at: 1, text: openHigh ? `≥${end}` : end, side: "high" },
    ];
    const top = Math.floor(Math.log10(largest) + 1e-9);
    // Clear of the end labels (the width of their text, ~7 px a character, and half a decade
    // label) and of 0.
    const endPx = Math.max(LABEL_PX, 7 * out[2].text.length + 16);
    for (let k = top; k >= Math.ceil(bottom - 1e-9); k -= stride) {
      const at = position(10 ** k);
      if (at < 1 - endPx / width && at > 0.5 + (0.6 * LABEL_PX) / width) {
        const text = k === 0 ? "1" : `1e${k}`;
        out.push({ at, text }, { at: 1 - at, text: `−${text}` });
      }
    }
    return out;
  };
  let describe = `sign and decade of magnitude, ${formatNumber(smallest, 2)} … ${formatNumber(largest, 2)} each side of 0`;
  const beyond = [
    openHigh ? `the outermost buckets also count every magnitude above ${formatNumber(largest, 2)}` : null,
    openLow ? `the innermost every non-zero one below ${formatNumber(smallest, 2)}` : null,
  ].filter(Boolean);
  if (beyond.length) describe += ` (${beyond.join(", ")})`;
  return { position, labels, zero: 0.5, describe };
}

// A histogram tag over steps, on `axis` (`histogramAxis`).
export function histogramView(histogram, axis, width) {
  const values = decodeFloats(histogram.values);
  const steps = histogram.steps.length;
  const buckets = histogram.buckets;
  const columns = Math.max(50, Math.floor(width));
  // At most 240 rows of pixels: with more steps, a row adds up consecutive steps.
  const rows = Math.min(steps, 240);
  const rowPx = Math.max(1, Math.min(6, Math.floor(240 / Math.max(1, rows))));
  const canvas = el("canvas", {
    class: "histogram-canvas", "data-tag": histogram.tag, "data-steps": steps, "data-kind": histogram.kind || "linear",
  });
  canvas.width = columns;
  canvas.height = Math.max(1, rows * rowPx);
  const context = canvas.getContext("2d");
  const image = context.createImageData(canvas.width, canvas.height);
  for (let r = 0; r < rows; r++) {
    const density = new Float64Array(columns);
    const last = Math.floor(((r + 1) * steps) / rows);
    for (let s = Math.floor((r * steps) / rows); s < last; s++) {
      for (let b = 0; b < buckets; b++) {
        const base = (s * buckets + b) * 3;
        const left = values[base];
        const right = values[base + 1];
        const count = values[base + 2];
        if (!(count > 0) || !Number.isFinite(left) || !Number.isFinite(right)) continue;
        // Spread the bucket's count over the pixel columns it covers.
        const from = Math.max(0, Math.floor(axis.position(left) * columns));
        const to = Math.min(columns - 1, Math.max(from, Math.ceil(axis.position(right) * columns) - 1));
        for (let c = from; c <= to; c++) density[c] += count / (to - from + 1);
      }
    }
    const top = Math.max(...density) || 1;
    for (let p = 0; p < rowPx; p++) {
      for (let c = 0; c < columns; c++) {
        const i = 4 * ((r * rowPx + p) * columns + c);
        const t = density[c] / top;
        const rgb = t > 0 ? colorAt(0.15 + 0.85 * t) : [250, 250, 250];
        image.data.set([rgb[0], rgb[1], rgb[2], 255], i);
      }
    }
  }
  context.putImageData(image, 0, 0);
  canvas.style.width = `${columns}px`;
  canvas.style.height = `${canvas.height}px`;
  const ticks = axis.labels(columns).map(({ at, text, side }) => {
    const tick = el("span", { class: side || (text === "0" ? "zero-tick" : "decade-tick"), text });
    if (!side) tick.style.left = `${at * 100}%`;
    return tick;
  });
  const box = el("div", { class: "histogram-axis", "data-kind": histogram.kind || "linear" }, ticks);
  box.style.width = `${columns}px`;
  const zero = axis.zero === null ? null : el("span", { class: "zero-line" });
  if (zero) zero.style.left = `${axis.zero * 100}%`;
  let stepsText = steps ? `${steps} steps, ${histogram.steps[0]} (top) … ${histogram.steps[steps - 1]} (bottom)` : "no steps";
  if (rows < steps) stepsText += `; a row of pixels adds up ~${Math.round(steps / rows)} steps`;
  return el("figure", { class: "histogram", "data-run": histogram.run, "data-tag": histogram.tag, "data-kind": histogram.kind || "linear" }, [
    el("figcaption", { text: `${histogram.run}: ${histogram.tag}` }),
    el("div", { class: "histogram-plot" }, [canvas, zero]),
    box,
    el("div", { class: "histogram-steps", text: stepsText }),
  ]);
}
