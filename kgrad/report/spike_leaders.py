"""Which layers moved most in a step the guard skipped: its weights ranked by z-score.

For each skipped step the guard's replay records, per trainable weight, the
values of `VALUE_NAMES` and each one's z-score against the weight's running
statistics (``skip_<value>/<weight>``, ``skip_z_<value>/<weight>``).
`rank_skip_leaders` ranks them under the two rules of `kgrad.report.spike_rules`:
values whose sizes cannot be told apart are a tie, said as one; a weight whose
gradient is rounding noise is not scored, and the result says which and why.

Example:

>>> values = {"grad_norm": {"attn/query/kernel": 2.0, "attn/key/kernel": 1.5, "attn/key/bias": 3e-9},
...           "update_ratio": {"attn/query/kernel": 0.3, "attn/key/kernel": 0.02, "attn/key/bias": 0.5}}
>>> z_scores = {"grad_norm": {"attn/query/kernel": 40.0, "attn/key/kernel": 3.0, "attn/key/bias": 90.0},
...             "update_ratio": {"attn/query/kernel": 12.0, "attn/key/kernel": 1.0, "attn/key/bias": 80.0}}
>>> leaders = rank_skip_leaders(values, z_scores)
>>> [(entry.weight, entry.value_name, entry.z) for entry in leaders.groups[0]]
[('attn/query/kernel', 'grad_norm', 40.0)]
>>> [weight for weight, _ in leaders.not_scored]
['attn/key/bias']
"""

import dataclasses
import math
import typing

from kgrad.report.spike_rules import (  # noqa: F401 (ROUNDING_NOISE_RATIO, TIE_TOLERANCE: the rules' constants)
    ROUNDING_NOISE_RATIO,
    TIE_TOLERANCE,
    layer_of_weight,
    rounding_noise,
    tie_text,
    tied_by_size,
)

#: The per-weight values the guard's replay records for a skipped step (``skip_<name>/<weight>``).
VALUE_NAMES = ("grad_norm", "update_ratio", "cos_grad_weight", "adam_rms")


class SkipLeader(typing.NamedTuple):
    """One scored value of one weight in a skipped step.

    Attributes:
        layer: The weight's layer (its path less the last part).
        weight: The weight's path (``dense_1/kernel``).
        value_name: One of `VALUE_NAMES`.
        z: Its z-score against the weight's running statistics.
        value: Its value in the skipped step.
    """

    layer: str
    weight: str
    value_name: str
    z: float
    value: float


@dataclasses.dataclass(frozen=True)
class SkipLeaders:
    """What moved in one skipped step, from `rank_skip_leaders`.

    Attributes:
        groups: Tuple of tied groups (tuples of `SkipLeader`), largest ``|z|`` first.
        not_scored: Tuple of ``(weight, reason)`` pairs: weights left out, and why.
        sigmas: How many σ a value must be above its history to have moved.
        named: How many layers `describe` names.
    """

    groups: tuple
    not_scored: tuple
    sigmas: float = 6.0
    named: int = 5

    def layers(self):
        """The layers, each at its largest ``|z|``, in tied groups, largest first (tuples of `SkipLeader`)."""
        best = {}
        for group in self.groups:
            for entry in group:
                if entry.layer not in best:  # groups are largest first: the first seen is the largest
                    best[entry.layer] = entry
        return tied_by_size(list(best.values()), lambda entry: abs(entry.z))

    def describe(self):
        """Words for a person: which layers moved most, first; ties said as ties; what was not scored.

        Returns:
            A ``str`` of one or more lines.
        """
        groups = self.layers()
        moved = [[entry for entry in group if abs(entry.z) >= self.sigmas] for group in groups]
        moved = [group for group in moved if group]
        if moved:
            lines = [f"moved most (above {self.sigmas:g}σ of their history), largest first: "
                     + "; ".join(_groups_text(moved, self.named))]
        elif groups:
            lines = [f"no layer's value was above {self.sigmas:g}σ of its history; the largest: "
                     + "; ".join(_groups_text(groups[:1], self.named))]
        else:
            lines = ["no value could be scored"]
        if self.not_scored:
            shown = "; ".join(f"{weight} ({reason})" for weight, reason in self.not_scored[: self.named])
            more = len(self.not_scored) - self.named
            lines.append(f"not scored: {shown}" + (f" and {more} more" if more > 0 else ""))
        return "\n".join(lines)


def rank_skip_leaders(values, z_scores, *, sigmas=6.0, named=5):
    """Ranks the weights of a skipped step by how far each value moved from its history.

    Args:
        values: ``{value_name: {weight_path: float}}``, the skipped step's values
            (``value_name`` in `VALUE_NAMES`; ``adam_rms`` absent without a second moment).
        z_scores: The same shape: each value's z-score against the weight's
            running statistics, absent where there was not enough history.
        sigmas: How many σ make a value count as moved (in `SkipLeaders.describe`).
        named: How many layers `SkipLeaders.describe` names.

    Returns:
        A `SkipLeaders`. Weights whose ``grad_norm`` is rounding noise
        (`rounding_noise`), or that have no z-score at all, are in ``not_scored``.

    Raises:
        ValueError: ``values`` or ``z_scores`` is not a dict of dicts keyed by `VALUE_NAMES`.
    """
    _check_values("values", values)
    _check_values("z_scores", z_scores)
    excluded = dict(rounding_noise(values.get("grad_norm", {})))
    weights = _weights_in_order(values, z_scores)
    entries = []
    for weight in weights:
        if weight in excluded:
            continue
        scored = [(name, z_scores[name][weight]) for name in VALUE_NAMES if weight in z_scores.get(name, {})]
        scored = [(name, float(z)) for name, z in scored if not math.isnan(z)]
        if not scored:
            excluded[weight] = "no z-score: not enough history of its values yet"
            continue
        for name, z in scored:
            value = values.get(name, {}).get(weight, math.nan)
            entries.append(SkipLeader(layer_of_weight(weight), weight, name, z, float(value)))
    groups = tied_by_size(entries, lambda entry: abs(entry.z))
    not_scored = tuple((weight, excluded[weight]) for weight in weights if weight in excluded)
    return SkipLeaders(tuple(tuple(group) for group in groups), not_scored, sigmas, named)


def _groups_text(groups, named):
    texts, left = [], named
    for group in groups:
        if left <= 0:
            rest = sum(len(other) for other in groups[len(texts):])
            texts.append(f"and {rest} more")
            break
        texts.append(tie_text(group, _entry_name, _entry_size, named=left, together="tied"))
        left -= len(group)
    return texts


def _entry_name(entry):
    return entry.layer


def _entry_size(entry):
    return f"{entry.value_name} of {entry.weight.rpartition('/')[2]} z {entry.z:.3g}, {entry.value:.3g}"


def _weights_in_order(values, z_scores):
    weights = []
    for table in (values, z_scores):
        for name in VALUE_NAMES:
            weights += [weight for weight in table.get(name, {}) if weight not in weights]
    return weights


def _check_values(argument, table):
    if not isinstance(table, dict) or not all(isinstance(inner, dict) for inner in table.values()):
        raise ValueError(f"`{argument}` must be a dict {{value_name: {{weight_path: float}}}}. "
                         f"Received: {argument}={table!r:.200}")
    unknown = sorted(set(table) - set(VALUE_NAMES))
    if unknown:
        raise ValueError(f"`{argument}` has unknown value names {unknown}; expected some of "
                         f"{list(VALUE_NAMES)}. Rename them, or leave them out.")
