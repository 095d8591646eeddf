"""The stability report in words, for ``kgrad report``: loss spikes, what spiked first, what was not scored.

Ties are said as ties, with their sizes (`kgrad.report.spike_rules.tie_text`):
the signals that spiked at one probe are "N at once", largest first, never an
order of causes.

Example:

>>> from kgrad.report.stability import Lead
>>> lead = lambda layer, step, size: Lead(layer, "adam_rms", f"adam_rms/{layer}/kernel", step, 52 - step, size)
>>> tie_words([lead("b", 51, 40.0), lead("a", 51, 12.0)], named=5)
'at step 51 (1 probe ahead), 2 at once: b adam_rms (40σ), a adam_rms (12σ)'
"""

import math

from kgrad.plan.tag_names import LOSS_TAG
from kgrad.report.spike_rules import tie_text


def describe(report, named=5):
    """Lines for ``kgrad report``: each loss spike and what spiked first; the other spikes counted.

    Returns ``[]`` when nothing spiked and nothing was left out.
    """
    if report is None or not (report.spikes or report.not_scored):
        return []
    rule = f"above mean + {report.sigmas:g}σ of the previous {report.history} probes"
    lines = [f"stability: spikes ({rule}):"]
    for loss in report.loss_spikes:
        line = f"  loss spike at step {loss.step}: {_value(loss.value)} (mean {_value(loss.mean)}"
        line += f" ± {_value(loss.std)})"
        if loss.leaders:
            groups = "; ".join(tie_words(tie, named) for tie in ties(loss.leaders))
            line += f"; first, within {report.window} probes: {groups}"
        else:
            line += f"; no layer signal spiked within {report.window} probes before it"
        lines.append(line)
    for tag, found in report.spikes.items():
        if tag != LOSS_TAG:
            steps = ", ".join(str(spike.step) for spike in found[:named])
            at = "at steps" if len(found) > 1 else "at step"
            more = f" and {len(found) - named} more" if len(found) > named else ""
            plural = "s" if len(found) > 1 else ""
            lines.append(f"  {tag}: {len(found)} spike{plural}, {at} {steps}{more}")
    for tag, reason in report.not_scored:
        lines.append(f"  not scored: {tag} ({reason})")
    return lines


def ties(leaders):
    """A loss spike's ``leaders`` grouped by their step, earliest first: a tie is not a chain of causes.

    Within a group the leaders keep their order (largest first, as `stability_report` gives them).

    >>> from kgrad.report.stability import Lead
    >>> lead = lambda layer, step: Lead(layer, "adam_rms", f"adam_rms/{layer}", step, 52 - step)
    >>> [[spike.layer for spike in tie] for tie in ties([lead("a", 49), lead("b", 51), lead("c", 51)])]
    [['a'], ['b', 'c']]
    """
    groups = {}
    for lead in leaders:
        groups.setdefault(lead.step, []).append(lead)
    return [groups[step] for step in sorted(groups)]


def tie_words(tie, named):
    """One group of leaders at one probe: its step, how far ahead, and each signal with its size."""
    first = tie[0]
    at = f"at step {first.step} ({_ahead(first.probes_ahead)})"
    said = tie_text(tie, lambda lead: f"{lead.layer} {lead.signal}",
                    lambda lead: sigmas_text(lead.sigmas), named)
    return f"{at}{':' if len(tie) == 1 else ','} {said}"


def sigmas_text(sigmas):
    """A size in σ as the report says it: ``"51σ"``, ``"NaN/Inf or σ 0"``.

    >>> sigmas_text(512.4), sigmas_text(6.25), sigmas_text(float("inf")), sigmas_text(float("nan"))
    ('512σ', '6.2σ', 'NaN/Inf or σ 0', 'size unknown')
    """
    if math.isnan(sigmas):
        return "size unknown"
    if not math.isfinite(sigmas):
        return "NaN/Inf or σ 0"
    return f"{sigmas:.0f}σ" if abs(sigmas) >= 10 else f"{sigmas:.2g}σ"


def _ahead(probes):
    return "the same probe" if probes == 0 else f"{probes} probe{'s' if probes > 1 else ''} ahead"


def _value(value):
    return f"{value:.3g}" if math.isfinite(value) else str(value)
