"""A `kgrad.ProbeTape`'s update as the spike rule skips and measures it (TensorFlow, a model's own step).

Example (in a model's own ``train_step``, at the tape's guarded ``apply``)::

    spike_update = own_step_update(name, optimizer, grads, variables, measured)
"""


def own_step_update(name, optimizer, grads, variables, measured):
    """`record_skip`'s ``(optimizer, the update's pairs, the checked pairs)`` of a `kgrad.ProbeTape`'s update.

    ``measured``: the tape's ``(gradient, weight)`` pairs in its rows' order
    (the weight gradients last to first, `kgrad.backends.tensorflow.guard.watched.watched_tensors`).

    Raises:
        ValueError: When this optimizer does not update every weight the tape
            differentiated: the spike rule judges the tape's gradients as one step.
    """
    applied = [(g, v) for g, v in zip(grads, variables) if g is not None]
    updated = {id(v) for _, v in applied}
    missing = [w.path for _, w in measured if id(w) not in updated]
    if missing:
        raise ValueError(
            f"kgrad.NonFiniteGuard(skip_spikes=True): ProbeTape {name!r} differentiated weights that "
            f"its optimizer's update does not include ({', '.join(missing)}), so a spiking step of "
            "the tape cannot be skipped as one update. Received: an update of "
            f"{len(applied)} weights. Apply each tape's gradients in one optimizer call, or pass "
            "skip_spikes=False."
        )
    return optimizer, applied, measured
