"""Where a `kgrad.GradientProbe` writes, and what of a record reaches TensorBoard."""

import dataclasses
import os


def for_tensorboard(record):
    """A step the loss scaler skipped is logged as such, not as an explosion.

    Its gradients overflowed on purpose (the loss scaler probes for the
    largest usable scale), and it shares its step with the next step, as
    ``optimizer.iterations`` does not advance: only the loss-scale tags are
    written. ``on_probe`` and ``latest`` still get the whole record.
    """
    if record.scalars.get("global/loss_scale_skipped", 0.0) < 1.0:
        return record
    scalars = {
        tag: value for tag, value in record.scalars.items() if tag.startswith("global/loss_scale")
    }
    return dataclasses.replace(record, scalars=scalars, histograms={})


def writable(log_dir):
    """``log_dir``, checked writable without creating it (the writer creates it lazily).

    A fit that fails before its first probed step then leaves no folder.
    """
    existing = os.path.abspath(log_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    problem = None
    if not os.path.isdir(existing):
        problem = f"{existing!r} is a file"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"{existing!r} is not writable"
    if problem is not None:
        raise ValueError(
            f"`log_dir` cannot be written: log_dir={log_dir!r} ({problem}). "
            "Pass a directory you can write to, e.g. log_dir='logs/run1'."
        )
    return log_dir
