"""The two rules of every spike kgrad reports: ties are ties, rounding noise is not scored.

Written once, used by the guard's skipped steps (`kgrad.report.spike_leaders`)
and by the stability report's "what moved first" (`kgrad.report.stability`):

- **Ties are ties.** Signals that cross at the same probe are one group, said
  with their sizes ("3 at once: a (41σ), b (40σ), c (12σ)"), never as an
  order of causes; sizes that cannot be told apart (`tied_by_size`) are one
  group too.
- **Rounding noise is not scored.** A weight whose gradient is zero in exact
  arithmetic (an attention layer's key bias: softmax is invariant to a
  constant added to every key's score) gets a float32 gradient of rounding
  errors, ~1e-8 of its layer's other weights'. Any statistic of it (its
  ``adam_rms``, a z-score) measures float32, not training: `rounding_noise`
  names such weights and says why, and they are left out of every ranking.

Example:

>>> [weight for weight, _ in rounding_noise({"mha/key/kernel": 0.5, "mha/key/bias": 2e-9})]
['mha/key/bias']
>>> tied_by_size([12.0, 41.0, 40.0], float)
[[41.0, 40.0], [12.0]]
"""

import math

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


def layer_of_weight(weight):
    """The layer of a weight path: the path less its last part.

    >>> layer_of_weight("block_1/attention/key/bias"), layer_of_weight("bias")
    ('block_1/attention/key', 'bias')
    """
    return weight.rpartition("/")[0] or weight


def rounding_noise(grad_norms, what="gradient norm"):
    """The weights whose gradient is rounding noise, and why: ``[(weight, reason)]``.

    A weight is noise when its gradient norm is exactly 0, or at most
    `ROUNDING_NOISE_RATIO` of the largest gradient norm of its layer's other
    weights (the same layer: the same path less its last part). A non-finite
    norm is a blow-up, never noise; a weight alone in its layer is compared
    with nothing, so it is noise only when exactly 0.

    Args:
        grad_norms: ``{weight_path: gradient norm}``, one step's (or a typical) value per weight.
        what: How the reason names those values.

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
            found.append((weight, f"its {what} is exactly 0"))
            continue
        others = [(other, size) for other, size in by_layer[layer_of_weight(weight)] if other != weight]
        if not others:
            continue
        largest, size = max(others, key=lambda pair: pair[1])
        if norm <= ROUNDING_NOISE_RATIO * size:
            found.append((weight, f"rounding noise: {what} {norm:.2g}, {norm / size:.1g} x that of "
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
