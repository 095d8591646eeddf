// The first screen's flag summary; the health table, the NaN/Inf timeline and the histogram view of a run.
import { decodeFloats, el, colorAt, formatNumber } from "./common.js";

const COLUMNS = [
  ["layer", "layer"],
  ["grad_norm", null], // the run's gradient, ‖dJ/dw‖ (its "weight grad") or ‖dJ/d(output)‖
  ["trend", "trend"],
  ["ratio_to_max", "/ largest"],
  ["zero_fraction", "zero act"],
  ["update_ratio", "update/w"],
  ["nonfinite", "NaN/Inf"],
  ["flags", "flags"],
];

function flagTexts(row) {
  if (!row.flags.length) return ["ok"];
  return row.flags.map((flag) =>
    flag in row.first_flagged ? `${flag.toUpperCase()} since step ${row.first_flagged[flag]}` : flag.toUpperCase(),
  );
}

// The flags, each on one piece ("VANISHING since step 120"): the cell wraps between
// flags, never inside one, so the column is narrow enough to be shown whole.
function flagCell(row) {
  const texts = flagTexts(row);
  return el("td", { class: "col-flags" }, texts.map((text, index) => el("span", { class: "flag", text: index < texts.length - 1 ? `${text}, ` : text })));
}

function cellText(row, key) {
  if (key === "layer") return row.layer;
  if (key === "trend") {
    if (typeof row.trend === "string") return row.trend; // "from 0": grew from a norm of exactly 0
    return row.trend === null ? "–" : `×${formatNumber(row.trend, 2)}`;
  }
  if (key === "nonfinite") {
    // The default statistics count dJ/d(output)'s NaN/Inf, not dJ/dw's: say its NaN/Inf norm instead of 0.
    if (row.nonfinite === 0 && row.nonfinite_norms > 0) return `norm (${row.nonfinite_norms} step${row.nonfinite_norms === 1 ? "" : "s"})`;
    return String(row.nonfinite);
  }
  if (key === "grad_norm" && typeof row.grad_norm === "string") return row.grad_norm; // a logged NaN/Inf
  if (key === "zero_fraction") return row.zero_fraction === null ? "–" : row.zero_fraction.toFixed(2);
  return formatNumber(row[key], 2);
}

// The table of `kgrad report` for one run, with the step each flag first held.
export function healthTable(summary) {
  const head = el("tr", {}, COLUMNS.map(([, title]) => el("th", { text: title ?? `‖${summary.gradient}‖`, title: title ? undefined : summary.gradient_name })));
  const rows = summary.health.map((row) =>
    el(
      "tr",
      { class: row.flags.length ? "flagged" : "", "data-layer": row.layer, "data-flags": row.flags.join(" ") },
      COLUMNS.map(([key]) => (key === "flags" ? flagCell(row) : el("td", { class: `col-${key}`, text: cellText(row, key) }))),
    ),
  );
  const caption = el("caption", {
    text: `${summary.probes} probes, steps ${summary.first_step ?? "–"}..${summary.last_step ?? "–"}; ${summary.gradient_name} = ${summary.gradient}` + (summary.comparison ? `; ${summary.comparison}` : ""),
  });
  return el("table", { class: "health", "data-run": summary.run }, [caption, el("thead", {}, head), el("tbody", {}, rows)]);
}

// Which runs shown have flagged layers, and how many per flag, before any heatmap: where
// the runs stack (<= 1100 px) a flagged run may start below the fold, under an all-green
// one. Flagged runs first; a click scrolls to the run.
export function flagSummary(summaries) {
  const lines = summaries.map((summary) => {
    const counts = new Map();
    for (const row of summary.health) for (const flag of row.flags) counts.set(flag, (counts.get(flag) || 0) + 1);
    const parts = [...counts].map(([flag, count]) => `${count} layer${count === 1 ? "" : "s"} ${flag.toUpperCase()}`);
    return { run: summary.run, flagged: parts.length > 0, text: `${summary.run}: ${parts.length ? parts.join(", ") : "no layer flagged"}` };
  });
  lines.sort((a, b) => Number(b.flagged) - Number(a.flagged));
  return el("div", { class: "flag-summary", "data-role": "flag-summary" }, lines.map((line) => {
    const button = el("button", {
      type: "button",
      class: "flag-line" + (line.flagged ? " flagged" : ""),
      "data-run": line.run,
      title: `Go to ${line.run}`,
      text: line.flagged ? `⚠ ${line.text}` : line.text,
    });
    button.addEventListener("click", () => {
      const column = [...document.querySelectorAll("section.run-column")].find((node) => node.dataset.run === line.run);
      if (column) column.scrollIntoView({ block: "start" });
    });
    return button;
  }));
}

// Which layers had NaN/Inf, when; the NonFiniteGuard's report when one tripped.
export function timelineView(summary) {
  const box = el("div", { class: "timeline", "data-run": summary.run });
  const guards = summary.guard || [];
  if (!summary.nonfinite.length && !guards.length) {
    box.append(el("p", { class: "all-finite", text: "No NaN/Inf on any probed step." }));
    return box;
  }
  const first = summary.first_step ?? 0;
  const steps = [summary.last_step ?? 0, ...guards.map((g) => g.step ?? 0), ...summary.nonfinite.flatMap((e) => e.steps)];
  const last = Math.max(first + 1, ...steps);
  const position = (step) => `${(100 * (step - first)) / (last - first)}%`;
  const MAX_ROWS = 40;
  for (const entry of summary.nonfinite.slice(0, MAX_ROWS)) {
    const track = el("div", { class: "track" });
    // One mark per 0.25% of the axis at most: thousands of bad steps stay a few hundred elements.
    const seen = new Set();
    entry.steps.forEach((step, index) => {
      const slot = Math.round((400 * (step - first)) / (last - first));
      if (seen.has(slot)) return;
      seen.add(slot);
      const mark = el("span", { class: "mark", "data-step": step, title: entry.norm ? `step ${step}: norm ${entry.counts[index]}` : `step ${step}: ${entry.counts[index]} NaN/Inf` });
      mark.style.left = position(step);
      track.append(mark);
    });
    for (const guard of guards) {
      const line = el("span", { class: "guard-line", title: `guard tripped at step ${guard.step}` });
      line.style.left = position(guard.step ?? 0);
      track.append(line);
    }
    const more = entry.bad_steps > entry.steps.length ? ` (${entry.bad_steps} steps)` : "";
    box.append(
      el("div", { class: "timeline-row", "data-layer": entry.layer, "data-tag": entry.tag }, [
        el("span", { class: "timeline-label", text: `${entry.layer} · ${entry.kind}${more}`, title: entry.tag }),
        track,
      ]),
    );
  }
  if (summary.nonfinite.length > MAX_ROWS) {
    box.append(el("p", { class: "hint", text: `… and ${summary.nonfinite.length - MAX_ROWS} more tags with NaN/Inf.` }));
  }
  box.append(el("div", { class: "timeline-axis", text: `steps ${first} … ${last}` }));
  for (const guard of guards) {
    box.append(
      el("div", { class: "guard-report", "data-guard-step": guard.step, "data-guard-layer": guard.layer }, [
        el("strong", { text: `NonFiniteGuard tripped at step ${guard.step}: ` }),
        el("span", { text: guard.message || "" }),
      ]),
    );
  }
  return box;
}

// The hover tooltip of a heatmap cell (`null`: none), beside the cursor.
export function showTip(tip, cell, event, label) {
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
  tip.style.left = "0px"; // measured where nothing squeezes it
  tip.style.top = "0px";
  const box = tip.getBoundingClientRect();
  const right = event.clientX + 14 + box.width <= window.innerWidth;
  const below = event.clientY + 14 + box.height <= window.innerHeight;
  tip.style.left = `${Math.max(0, right ? event.clientX + 14 : event.clientX - 14 - box.width)}px`;
  tip.style.top = `${Math.max(0, below ? event.clientY + 14 : event.clientY - 14 - box.height)}px`;
}
