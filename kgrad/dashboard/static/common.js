// Shared helpers of the kgrad tab and the HTML report: decoding, colours,
// number formats, DOM building. Everything drawn from the logs goes into
// the page as textContent or attributes, never as HTML.

// Float32 values sent as base64 (row-major), NaN kept.
export function decodeFloats(base64) {
  const text = atob(base64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return new Float32Array(bytes.buffer);
}

// An element with attributes, properties and children; text stays text.
export function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("data-") || key === "title" || key === "role") node.setAttribute(key, String(value));
    else node[key] = value;
  }
  for (const child of [].concat(children)) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

// Viridis, from dark purple (small) to yellow (large): readable in grey too.
const VIRIDIS = [
  [68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142],
  [31, 158, 137], [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37],
];
export const MISSING_RGB = [225, 225, 225];
export const NONFINITE_RGB = [229, 57, 53];
// A logged 0 on a log scale (a dead layer's dJ/dw, a weight that did not move) is
// below every colour of the scale: black, not the scale's darkest purple, which
// would say "small" where the value is none at all.
export const ZERO_RGB = [0, 0, 0];

// RGB of a position in [0, 1] on the colour map.
export function colorAt(t) {
  const x = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const f = x - i;
  return VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
}

// Maps a value to [0, 1] on a colour scale {scale, low, high} (log10 or linear);
// NaN (not logged) stays NaN, +-Inf (a logged NaN/Inf) is Infinity, and 0 on a
// log scale (log10(0) = -inf) is -Infinity.
export function scalePosition(scale, value) {
  if (Number.isNaN(value)) return NaN;
  if (!Number.isFinite(value)) return Infinity;
  if (scale.scale === "log") {
    if (value <= 0) return -Infinity;
    const span = scale.high - scale.low;
    return span > 0 ? (Math.log10(value) - scale.low) / span : 0.5;
  }
  const span = scale.high - scale.low;
  return span > 0 ? (value - scale.low) / span : 0.5;
}

// One colour scale for the heatmaps shown side by side, so that they compare.
export function sharedScale(heatmaps) {
  const log = heatmaps.length && heatmaps[0].scale === "log";
  const lows = heatmaps.map((h) => h.min).filter((v) => v !== null);
  const highs = heatmaps.map((h) => h.max).filter((v) => v !== null);
  if (!lows.length) return { scale: log ? "log" : "linear", low: 0, high: 1 };
  let low = Math.min(...lows);
  let high = Math.max(...highs);
  if (log) {
    low = Math.floor(Math.log10(low));
    high = Math.ceil(Math.log10(high));
    if (high === low) high = low + 1;
    return { scale: "log", low, high };
  }
  return { scale: "linear", low: Math.min(0, low), high: Math.max(1, high) };
}

// A number as people read it in a table: 3 significant digits, e notation when small.
export function formatNumber(value, digits = 3) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (!Number.isFinite(value)) return "NaN/Inf";
  if (value === 0) return "0";
  const magnitude = Math.abs(value);
  if (magnitude >= 1e-2 && magnitude < 1e4) return String(Number(value.toPrecision(digits)));
  return value.toExponential(digits - 1);
}

// Row labels: 12 px text (style.css' .row-label), measured on a canvas, nothing drawn.
export const LABEL_FONT = '12px Roboto, "Helvetica Neue", Arial, sans-serif';
const measuring = document.createElement("canvas").getContext("2d");

export function textWidth(text, font = LABEL_FONT) {
  measuring.font = font;
  return measuring.measureText(text).width;
}

// `text` within `px`: whole, else its path shortened where rows differ least: the middle
// parts first ("transformer_layer_0/…/query"), then the middle of its first part
// ("transfo…layer_0/feedforward_intermediate_dense"), its last part whole. An ellipsis at
// the end made 16 of 19 rows read "transformer_layer_0/self…".
export function fitText(text, px, font = LABEL_FONT) {
  const fits = (candidate) => textWidth(candidate, font) <= px;
  if (fits(text)) return text;
  const parts = text.split("/");
  const last = parts[parts.length - 1];
  const first = parts.length > 1 ? parts[0] : "";
  const joint = parts.length > 2 ? "/…/" : "/";
  if (parts.length > 2 && fits(first + joint + last)) return first + joint + last;
  for (let kept = first.length - 1; kept >= 4; kept--) {
    const head = `${first.slice(0, Math.ceil(kept / 2))}…${first.slice(first.length - Math.floor(kept / 2))}`;
    if (fits(head + joint + last)) return head + joint + last;
  }
  let tail = last; // the last part alone does not fit: its end, which tells rows apart
  while (tail.length > 1 && !fits(`…${tail}`)) tail = tail.slice(1);
  return `…${tail}`;
}
