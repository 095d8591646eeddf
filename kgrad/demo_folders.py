"""The demo's log folders: checked and cleared before Keras is imported.

``kgrad demo``'s usage errors (earlier logs, a folder that cannot be written)
come from here, so that they answer at once: this module imports neither
Keras nor TensorFlow (~3 s, more on a busy machine).
"""

import os
import shutil
import tempfile

#: The demo's run folders under its ``--log-dir`` (`kgrad.demo.MODELS`' keys).
RUNS = ("sigmoid_deep", "relu_deep")


def check_writable(log_dir):
    """Creates ``log_dir`` if needed and checks that a file can be written there.

    Before training, so that a folder that cannot be written ends in one
    line, not in a TensorFlow traceback after the first epoch.

    Raises:
        OSError: With a message that names the folder, what went wrong and
            what to do.

    Example:

    >>> from kgrad.demo_folders import check_writable
    >>> check_writable("/proc/kgrad-demo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    OSError: cannot write the demo's logs to --log-dir '/proc/kgrad-demo' (...). Pass --log-dir ...
    """
    try:
        os.makedirs(log_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=log_dir):
            pass
    except OSError as error:
        reason = error.strerror or str(error)
        if isinstance(error, FileExistsError):
            reason = "a file of that name is in the way"
        elif error.filename is not None:
            reason += f": {error.filename!r}"
        raise OSError(
            f"cannot write the demo's logs to --log-dir {os.fspath(log_dir)!r} ({reason}). "
            "Pass --log-dir a folder you can write to."
        ) from error


def prepare_log_dir(log_dir, overwrite):
    """Checks that the demo's run folders are free; clears them if ``overwrite``.

    Raises:
        OSError: If ``log_dir`` cannot be written (see `check_writable`).
        FileExistsError: If a run folder already holds files and ``overwrite``
            is False (new events would mix with the old ones in TensorBoard).
    """
    check_writable(log_dir)
    for run in RUNS:
        run_dir = os.path.join(log_dir, run)
        if os.path.isdir(run_dir) and os.listdir(run_dir):
            if not overwrite:
                raise FileExistsError(
                    f"The demo's run folder already holds logs: {run_dir!r}. Pass "
                    "--overwrite to replace them, or another --log-dir."
                )
            # Only the demo's own run folders are removed, never log_dir itself.
            shutil.rmtree(run_dir)
