"""The seam where a Keras backend plugs in.

Everything under ``kgrad/backends/<name>/`` runs inside that backend's traced
training step (capture, the backward pass, on-device summaries, the device
buffer, the guard's sentinel and its replay); everything outside
``kgrad/backends/`` is backend-free. The callbacks and the public names that
need a backend ask `current()` for the one Keras runs on, which provides what
`kgrad.backends.interface.Backend` describes.

>>> import kgrad.backends
>>> kgrad.backends.SUPPORTED_BACKENDS
('tensorflow', 'jax')
"""

import importlib

#: Keras backends kgrad runs on, each a package ``kgrad.backends.<name>``
#: whose ``backend`` module provides `kgrad.backends.interface.Backend`.
SUPPORTED_BACKENDS = ("tensorflow", "jax")


class UnsupportedBackendError(RuntimeError):
    """Raised when Keras runs on a backend kgrad (or one of its parts) does not support yet.

    Raised before ``fit`` starts, by the callback's constructor or its
    ``on_train_begin``; the message names the backend, what runs on it, and
    what to do (``KERAS_BACKEND=tensorflow``, or the part that runs there).

    Example:

    >>> import kgrad
    >>> try:
    ...     raise kgrad.UnsupportedBackendError("kgrad does not support Keras' 'torch' backend yet.")
    ... except kgrad.UnsupportedBackendError as error:
    ...     print(error)
    kgrad does not support Keras' 'torch' backend yet.
    """


def current():
    """The backend module for the backend Keras runs on (``keras.config.backend()``).

    Raises:
        UnsupportedBackendError: For a backend kgrad does not support yet,
            with what to do instead.
    """
    import keras

    name = keras.config.backend()
    if name not in SUPPORTED_BACKENDS:
        raise UnsupportedBackendError(
            f"kgrad does not support Keras' {name!r} backend yet. Received: "
            f"keras.config.backend()={name!r}; supported: {', '.join(SUPPORTED_BACKENDS)}. "
            "Set the environment variable KERAS_BACKEND=tensorflow (or jax) before Python imports "
            "Keras to probe this model. Logs written on another backend are read by "
            "`kgrad report`, `kgrad.read_logs` and the kgrad tab on any backend."
        )
    return importlib.import_module(f"kgrad.backends.{name}.backend")
