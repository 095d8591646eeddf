"""Which layers moved most in a spike: two rules, written once for every spike kgrad reports.

Both the guard's skipped steps (`rank_skip_leaders`, on the values its replay
records per weight) and the stability report's "what moved first" leaders
(`kgrad.report.stability`) follow them:

- **Ties are ties.** Signals that cross at the same probe are one group, said
  with their sizes ("3 at once: a (z 41), b (z 40), c (z 12)"), never as an
  order of causes. Sizes that cannot be told apart (`tied_by_size`) are one
  group even when ranked by size.
- **Rounding noise is not scored.** A weight whose gradient is zero in exact
  arithmetic (an attention layer's key bias: softmax is invariant to a
  constant added to every key's score) gets a float32 gradient of rounding
  errors, ~1e-8 of its layer's other weights'. Any statistic of it (its
  ``adam_rms``, a z-score) measures float32, not training: `rounding_noise`
  names such weights and says why; they are left out of every ranking.

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

#: The per-weight values the guard's replay records for a skipped step (``skip_<name>/<weight>``).
VALUE_NAMES = ("grad_norm", "update_ratio", "cos_grad_weight", "adam_rms")

#: A weight whose gradient norm is at most this fraction of the largest of its
#: layer's other weights' is rounding noise. Why 2**-14 (6.1e-5): float32 rounds
#: each product and sum to a relative 2**-24 (6e-8); a gradient that is zero in
#: exact arithmetic is a sum of terms the size of its layer-mates' gradient terms
#: that cancel, and what is left is their rounding errors, which grow as √N for N
#: terms: 2**-14 leaves 2**10 = 1024 units of rounding (N up to ~10**6 terms: a
#: batch × sequence × head sum) before a weight counts as noise. A weight with a
#: true gradient that small beside its layer's other weights (measured: a key bias
#: at 3e-8 of its key kernel's; any real bias at 1e-2 or more) carries fewer than
#: two digits above its own rounding, so its statistics say little either way.
ROUNDING_NOISE_RATIO = 2.0**-14

#: Two sizes (z-scores, or σ above the mean) within this relative distance are a
#: tie: σ estimated from N = 128 probes has a relative standard error of
#: 1/√(2N) ≈ 6%, so z-scores within 10% of each other cannot be ordered.
TIE_TOLERANCE = 0.1


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


def layer_of_weight(weight):
    """The layer of a weight path: the path less its last part.

    >>> layer_of_weight("block_1/attention/key/bias"), layer_of_weight("bias")
    ('block_1/attention/key', 'bias')
    """
    return weight.rpartition("/")[0] or weight


def rounding_noise(grad_norms):
    """The weights whose gradient is rounding noise, and why: ``[(weight, reason)]``.

    A weight is noise when its gradient norm is exactly 0, or at most
    `ROUNDING_NOISE_RATIO` of the largest gradient norm of its layer's other
    weights (the same layer: the same path less its last part). A non-finite
    norm is a blow-up, never noise; a weight alone in its layer is compared
    with nothing, so it is noise only when exactly 0.

    Args:
        grad_norms: ``{weight_path: gradient norm}``, one step's (or a typical) value per weight.

    Returns:
        ``(weight, reason)`` pairs, in the order of ``grad_norms``.

    >>> for weight, reason in rounding_noise({"mha/key/kernel": 0.5, "mha/key/bias": 2e-9, "mha/value/bias": 0.01}):
    ...     print(weight, "-", reason)
    mha/key/bias - rounding noise: gradient norm 2e-09, 4e-09 x that of mha/key/kernel (0.5), at most 6.1e-05 x: float32 rounding of a gradient that is zero in exact arithmetic
    """
    by_layer = {}
    for weight, norm in grad_norms.items():
        if math.isfinite(norm):
            by_layer.setdefault(layer_of_weight(weight), []).append((weight, float(norm)))
    found = []
    for weight, norm in grad_norms.items():
        if not math.isfinite(norm):
            continue
        if norm == 0:
            found.append((weight, "its gradient is exactly 0"))
            continue
        others = [(other, size) for other, size in by_layer[layer_of_weight(weight)] if other != weight]
        if not others:
            continue
        largest, size = max(others, key=lambda pair: pair[1])
        if norm <= ROUNDING_NOISE_RATIO * size:
            found.append((weight, f"rounding noise: gradient norm {norm:.2g}, {norm / size:.1g} x that of "
                                  f"{largest} ({size:.2g}), at most {ROUNDING_NOISE_RATIO:.2g} x: float32 "
                                  "rounding of a gradient that is zero in exact arithmetic"))
    return found


def tied_by_size(items, size):
    """``items`` ranked by ``size(item)``, largest first, in groups whose sizes cannot be told apart.

    A group holds the items within `TIE_TOLERANCE` (relative) of its largest;
    infinite sizes tie with each other. Items of one size keep their order.

    >>> tied_by_size([3.0, 40.0, 38.0, 12.0, math.inf], lambda x: x)
    [[inf], [40.0, 38.0], [12.0], [3.0]]
    """
    ranked = sorted(items, key=lambda item: -size(item))
    groups = []
    for item in ranked:
        if groups and _same_size(size(groups[-1][0]), size(item)):
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _same_size(largest, other):
    if math.isinf(largest) or math.isinf(other):
        return largest == other
    return largest - other <= TIE_TOLERANCE * abs(largest)


def tie_text(items, name, size, named=5, together="at once"):
    """How a tied group is said: one item, or ``"N at once: a (size), b (size) and M more"``.

    Args:
        items: The group.
        name: Item -> its name.
        size: Item -> its size, in words.
        named: How many items to name.
        together: What ties them: ``"at once"`` (the same probe) or ``"tied"`` (sizes).

    >>> tie_text(["a", "b", "c"], str, lambda x: "z 4", named=2)
    '3 at once: a (z 4), b (z 4) and 1 more'
    """
    shown = ", ".join(f"{name(item)} ({size(item)})" for item in items[:named])
    if len(items) == 1:
        return shown
    more = f" and {len(items) - named} more" if len(items) > named else ""
    return f"{len(items)} {together}: {shown}{more}"


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
