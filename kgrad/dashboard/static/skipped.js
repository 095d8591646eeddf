// The steps a NonFiniteGuard skipped as spikes, on the stability view: a band down the
// view at each one's column, and a list with the layers that moved most in each. What
// moved is ranked on the server (kgrad/report/spike_leaders.py): ties stay ties there
// and here, and weights whose gradient is rounding noise are listed as not scored.
import { el, formatNumber } from "./common.js";

// As stability.js places a column (one module body in the HTML report: a name of its own).
const skipX = (column, steps, width) => ((column + 0.5) / steps) * width;

// A purple band at each skipped step's column, labelled "skip" where there is room.
export function skippedMarks(view, width, labelWidth, plot) {
  let lastLabel = -Infinity;
  for (const skip of view.skipped || []) {
    if (skip.column === null) continue;
    const left = labelWidth + skipX(skip.column, view.steps.length, width);
    const band = el("span", { class: "skipped-step-line", "data-step": skip.step, title: `step ${skip.step} skipped by the guard` });
    band.style.left = `${left}px`;
    plot.append(band);
    if (left - lastLabel >= 40) {
      const label = el("span", { class: "skipped-step-label", text: `skip ${skip.step}` });
      label.style.left = `${left}px`;
      plot.append(label);
      lastLabel = left;
    }
  }
}

function groupView(group) {
  const chips = group.map((lead) => el("span", {
    class: "skip-lead", "data-layer": lead.layer, "data-z": lead.z,
    text: `${lead.layer} (${lead.value_name} z ${formatNumber(lead.z)})`,
  }));
  const head = group.length > 1 ? [el("span", { class: "tie-head", text: `${group.length} tied: ` })] : [];
  return el("span", { class: "skip-group", "data-size": group.length }, [...head, ...chips]);
}

// Each skipped step on one line: its step and spike score, the layers that moved most,
// largest first, tie by tie; what was not scored and why in its tooltip.
export function skippedList(view) {
  const skipped = view.skipped || [];
  if (!skipped.length) return null;
  const items = skipped.map((skip) => {
    const parts = [el("strong", { text: `step ${skip.step}` }), el("span", { text: ` spike score ${formatNumber(skip.score)}; ` })];
    if (!skip.groups.length) parts.push(el("span", { class: "first", text: skip.words }));
    else {
      parts.push(el("span", { class: "first", text: "moved most: " }));
      skip.groups.forEach((group, index) => {
        if (index) parts.push(el("span", { class: "tie-separator", text: "; " }));
        parts.push(groupView(group));
      });
    }
    if (skip.not_scored.length) {
      const names = skip.not_scored.map((item) => item.weight).join(", ");
      const why = skip.not_scored.map((item) => `${item.weight}: ${item.reason}`).join("\n");
      parts.push(el("span", { class: "not-scored", title: why, text: ` (not scored: ${names})` }));
    }
    return el("li", { "data-step": skip.step }, parts);
  });
  return el("div", { class: "skipped-steps" }, [
    el("div", { class: "skipped-steps-title", text: `Skipped steps (the guard did not apply their update), ${skipped.length}:` }),
    el("ol", {}, items),
  ]);
}
