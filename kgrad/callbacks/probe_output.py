"""Where a `kgrad.GradientProbe` writes, and what of a record reaches TensorBoard."""

import dataclasses
import os
import shutil
import warnings
import weakref


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


def checked_log_dir(log_dir):
    """``log_dir`` as a ``str`` path, or ``None``; anything else is refused, saying what to pass.

    >>> checked_log_dir(None), checked_log_dir("logs/run1")
    (None, 'logs/run1')
    """
    if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(
            f"`log_dir` must be a path (str or os.PathLike) or None. Received: log_dir={log_dir!r}."
        )
    return None if log_dir is None else os.fspath(log_dir)


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


def warn_unless_fitting(fitting, method):
    """Warns that a probe given to ``evaluate`` or ``predict`` probes nothing (but in fit's validation)."""
    if not fitting:
        warnings.warn(
            f"kgrad.GradientProbe was passed to model.{method}(), where no gradient is computed: it "
            f"probes nothing and writes no logs. Pass it to model.fit(callbacks=[...]); to see the "
            "gradients of a batch outside fit, use kgrad.ProbeTape or kgrad.prediction_gradient.",
            stacklevel=2,
        )


#: Per run folder (its real path): the model whose fit last wrote there in this process.
_WRITTEN_BY = weakref.WeakValueDictionary()


def claim(log_dir, model, overwrite):
    """Checks, before ``fit`` starts, that ``log_dir`` holds no kgrad run of an earlier fit.

    A second fit's steps would mix with the first's in TensorBoard, `kgrad.read_logs`
    and ``kgrad report`` (steps 0, 8, 16, 0, 8, 16). A later fit of the same model
    object in this process continues its run (its steps continue with the
    optimizer's ``iterations``); with ``overwrite`` the earlier runs are removed
    (only their ``kgrad`` folders). Folders on other file systems (``gs://``) are
    not checked.

    Raises:
        FileExistsError: Naming the folder, if it holds an earlier fit's kgrad run.

    Example:

    >>> import os, tempfile
    >>> log_dir = tempfile.mkdtemp()
    >>> os.makedirs(os.path.join(log_dir, "kgrad"))
    >>> open(os.path.join(log_dir, "kgrad", "events.out.tfevents.1"), "w").close()
    >>> claim(log_dir, model=None, overwrite=False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileExistsError: `log_dir` already holds the kgrad logs of an earlier fit: '.../kgrad'. ...
    >>> claim(log_dir, model=None, overwrite=True)
    >>> os.listdir(log_dir)
    []
    """
    if "://" in log_dir:
        return
    key = os.path.realpath(log_dir)
    earlier = earlier_runs(log_dir)
    continues = model is not None and _WRITTEN_BY.get(key) is model
    if earlier and not continues:
        if not overwrite:
            raise FileExistsError(
                "`log_dir` already holds the kgrad logs of an earlier fit: "
                f"{', '.join(repr(run) for run in earlier)}. This fit's steps would mix with them "
                "(in TensorBoard, kgrad.read_logs and kgrad report). Pass a new log_dir for each "
                "run (e.g. log_dir=f\"logs/{time.strftime('%Y%m%d-%H%M%S')}\"), or "
                f"GradientProbe({log_dir!r}, ..., overwrite=True) to replace them."
            )
        for run in earlier:
            shutil.rmtree(run)
    if model is not None:
        _WRITTEN_BY[key] = model


def earlier_runs(log_dir):
    """The kgrad run folders under ``log_dir`` that hold event files: ``kgrad`` and ``<tape>/kgrad``."""
    if not os.path.isdir(log_dir):
        return []
    candidates = [os.path.join(log_dir, "kgrad")] + [
        os.path.join(log_dir, name, "kgrad") for name in sorted(os.listdir(log_dir)) if name != "kgrad"
    ]
    return [
        run
        for run in candidates
        if os.path.isdir(run) and any(name.startswith("events.out.tfevents") for name in os.listdir(run))
    ]
