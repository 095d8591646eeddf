"""The instruments' warnings, worded once for both backends.

An instrument that cannot compute something says so once per trace (a step
is traced once per plan), naming what it left out and why.

>>> by_reason({"dense": "no logits", "out": "a sigmoid output", "head": "no logits"})
"'dense', 'head': no logits; 'out': a sigmoid output"
"""

import warnings


def warn_instrument(instrument, message):
    """Warns ``kgrad: instruments=['<instrument>']: <message>.``, pointing at the caller's caller."""
    # Once per trace, not per step: the step is traced once per plan.
    warnings.warn(f"kgrad: instruments=['{instrument}']: {message}.", stacklevel=4)


def by_reason(reasons):
    """``'a', 'b': why; 'c': other`` from ``{name: reason}``."""
    names = {}
    for name, reason in reasons.items():
        names.setdefault(reason, []).append(repr(name))
    return "; ".join(f"{', '.join(group)}: {reason}" for reason, group in names.items())
