"""Which second moment an optimizer keeps, for ``instruments=["optimizer"]`` on every backend.

`moment_rule` names how kgrad reads an optimizer's state (Adam and AdamW,
Nadam, Adamax), or says why it reads nothing (Lion, Adafactor, SGD with or
without momentum, others): the backends' ``optimizer_state`` modules compute
``adam_rms/`` and ``grad_outlier_fraction/`` from it, and warn with the reason.
"""

import keras

_NO_SECOND_MOMENT = (
    "keeps no second moment of the gradients, so it gives no adam_rms/ or "
    "grad_outlier_fraction/; update_rms/ is written"
)


def inner_optimizer(optimizer):
    """The optimizer whose state moves: a ``LossScaleOptimizer``'s inner one."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def moment_rule(optimizer):
    """``(rule, reason)``: ``"adam"``, ``"nadam"`` or ``"adamax"`` and ``None``, or ``None`` and why not.

    Example:

    >>> import keras
    >>> moment_rule(keras.optimizers.AdamW())
    ('adam', None)
    >>> print(moment_rule(keras.optimizers.SGD())[1])  # doctest: +NORMALIZE_WHITESPACE
    plain SGD keeps no state at all, so it gives no adam_rms/ or grad_outlier_fraction/;
    update_rms/ is written
    """
    optimizer = inner_optimizer(optimizer)
    name = type(optimizer).__name__
    if optimizer is None:
        return None, "no optimizer is known for these gradients; nothing is written"
    if getattr(optimizer, "gradient_accumulation_steps", None):
        return None, (
            f"{name} accumulates gradients (gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps}): its moments do not move every step"
        )
    if isinstance(optimizer, keras.optimizers.Nadam):
        return "nadam", None
    if isinstance(optimizer, keras.optimizers.Adamax):
        return "adamax", None
    if isinstance(optimizer, keras.optimizers.Adam):  # AdamW too
        return "adam", None
    if isinstance(optimizer, keras.optimizers.Lion):
        return None, f"Lion (its update is the sign of a momentum, ±lr per entry) {_NO_SECOND_MOMENT}"
    if isinstance(optimizer, keras.optimizers.Adafactor):
        return None, (
            "Adafactor's second moment is factored into row and column statistics: adam_rms/ "
            "and grad_outlier_fraction/ are not computed for it (yet); update_rms/ is written"
        )
    if isinstance(optimizer, keras.optimizers.SGD):
        if optimizer.momentum:
            return None, f"SGD with momentum {_NO_SECOND_MOMENT}"
        return None, "plain SGD keeps no state at all, " + _NO_SECOND_MOMENT.partition(", ")[2]
    return None, f"{name} is not one of Adam, AdamW, Adamax, Nadam: it {_NO_SECOND_MOMENT}"
