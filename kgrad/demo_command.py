"""``kgrad demo`` on the command line: refusals before Keras is imported, then the demo.

A backend kgrad cannot probe on, earlier logs and a folder that cannot be
written are refused in one line before anything is printed or created, and
before Keras (TensorFlow, ~3 s, more on a busy machine) is imported.
"""

import importlib
import importlib.util
import json
import os
import sys
import tempfile
import threading

from kgrad import demo_folders

#: Set by Ctrl-C: the demo's training stops at the next batch even where a library
#: swallowed the ``KeyboardInterrupt`` (one raised inside a ``__del__`` is only printed).
INTERRUPTED = threading.Event()

#: The package each Keras backend imports, and how to install it.
_BACKEND_INSTALLS = {
    "jax": 'pip install jax, or pip install -e ".[jax]" in kgrad\'s folder',
    "tensorflow": "pip install tensorflow",
    "torch": "pip install torch; kgrad does not run on PyTorch yet",
}


def run(args):
    """Runs ``kgrad demo`` for parsed ``args``; a refusal exits through ``args.parser``."""
    _refuse_an_unsupported_backend(args.parser)
    created = not os.path.lexists(args.log_dir)
    try:
        # Before Keras' import (~3 s, more on a busy machine): a usage error answers at once.
        demo_folders.prepare_log_dir(args.log_dir, args.overwrite)
    except OSError as error:  # earlier logs, or a folder that cannot be written
        args.parser.error(str(error))
    try:
        demo = import_quietly("kgrad.demo")
    except ModuleNotFoundError as error:
        if created:  # no empty folder left behind by a refusal
            os.rmdir(args.log_dir)
        if error.name not in _BACKEND_INSTALLS:
            raise
        _not_installed(args.parser, error.name)
    if keras_backend_name() != "tensorflow" and installed("tensorflow"):
        # Keras' TensorBoard callback (the demo's train/ and validation/ logs) imports
        # TensorFlow on JAX too, at its first use: here, its start-up lines (twice, one
        # per library it loads) would land in the middle of the demo's progress.
        import_quietly("tensorflow")
    try:
        demo.main(args.log_dir, epochs=args.epochs, overwrite=False, out=sys.stdout, interrupted=INTERRUPTED)
    except OSError as error:  # a folder that became unwritable meanwhile
        args.parser.error(str(error))
    return 0


def _not_installed(parser, package):
    backend = os.environ.get("KERAS_BACKEND")
    chosen = f"KERAS_BACKEND={backend}" if backend else "Keras' default backend"
    parser.error(
        f"{chosen} needs {package!r}, which is not installed. Install it "
        f"({_BACKEND_INSTALLS[package]}), or set KERAS_BACKEND to a backend that is installed "
        "(tensorflow or jax)."
    )


def installed(package):
    """Whether ``package`` is installed, found without importing it."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def keras_backend_name():
    """The backend Keras will pick, read as Keras reads it, without importing Keras.

    ``KERAS_BACKEND`` if set, else ``"backend"`` of ``$KERAS_HOME/keras.json``
    (``~/.keras/keras.json``), else TensorFlow.

    Example:

    >>> import os
    >>> os.environ["KERAS_BACKEND"] = "jax"
    >>> keras_backend_name()
    'jax'
    >>> del os.environ["KERAS_BACKEND"]
    """
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as file:
            return str(json.load(file).get("backend", "tensorflow"))
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def _refuse_an_unsupported_backend(parser):
    """One line, before anything is printed or created, for a backend the demo cannot run on."""
    backend = keras_backend_name()
    if backend in ("tensorflow", "jax"):
        if not installed(backend):
            _not_installed(parser, backend)
        return
    chosen = f"Keras' configured backend {backend!r}"
    if os.environ.get("KERAS_BACKEND"):
        chosen = f"KERAS_BACKEND={backend}"
    reason = "kgrad does not run on PyTorch yet" if backend == "torch" else "kgrad runs on tensorflow and jax"
    parser.error(
        f"{chosen}: {reason}. Run the demo with KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax "
        "(e.g. `KERAS_BACKEND=jax kgrad demo`)."
    )


def import_quietly(name):
    """Imports module ``name`` without TensorFlow's start-up lines on stderr.

    TensorFlow 2.21 writes them from C++ before its logging is set up, where
    ``TF_CPP_MIN_LOG_LEVEL`` does not reach, so stderr goes to a temporary
    file during the import; it is shown only if the import fails.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            module = importlib.import_module(name)
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    import absl.logging  # Python-side warnings of TensorFlow and Keras

    absl.logging.set_verbosity(absl.logging.ERROR)
    return module
