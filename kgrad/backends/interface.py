"""What a backend provides to the backend-free rest of kgrad.

`kgrad.backends.current()` returns a module with these names. The
callbacks (`kgrad.GradientProbe`, `kgrad.NonFiniteGuard`) use only them; a
second backend (``kgrad/backends/jax/``) implements the same names, and the
tags it writes are those of `kgrad.plan.tag_names`, so that the logs, the
report and the kgrad tab read its runs as they read TensorFlow's.

These protocols are documentation and a checklist, not base classes: the
TensorFlow backend's ``backend`` module is checked against them in
``tests/test_backend_seam.py``, the JAX backend's (and what its ``attach``
returns) in ``tests/jax/test_backend_seam_jax.py``.
"""

import typing


class HandOver(typing.Protocol):
    """The device buffer of one probed model or tape: records read only after steps that probed."""

    weight_shapes: dict

    def read_since(self, delivered, latest=None):
        """``(records, delivered)``: the `kgrad.ProbeRecord`s written since ``delivered``."""


class GuardCheck(typing.Protocol):
    """The guard's every-step sentinel of one model or tape."""

    def read_report(self, latest_summaries):
        """The `kgrad.NonFiniteReport` of a tripped step, or ``None``."""

    def reset(self):
        """Clears the trip, to go on training (``action="warn"``)."""


class TrainingStep(typing.Protocol):
    """The probing ``train_step`` installed on a model for one ``fit``.

    A guard's step may also say ``reports_at_epoch_end = True`` (JAX): its
    batch ends then only read the trip flag and stop training, and
    `kgrad.NonFiniteGuard` reports at the epoch's end (Keras may run batch
    ends in another thread there).
    """

    latest_record: object
    guard_tripped: object

    def start_at(self, first_step):
        """The next execution runs from step ``first_step`` (a probed execution)."""

    def start_epoch(self):
        """An epoch begins (the guard counts batches within it)."""

    def steps_run(self):
        """Steps the model has run, read from the device (at an epoch's end only)."""

    def pipelines(self):
        """``{tape name or None: HandOver}`` of the probed model and its own tapes."""

    def guard_states(self):
        """``{tape name or None: GuardCheck}``."""

    def tripped_batch(self):
        """``(data, seeds_after, batch_index)`` of the step that tripped the guard, or ``None``."""

    def batch_not_kept(self):
        """Why no batch was kept for the replay, or ``None``."""


class Backend(typing.Protocol):
    """The module `kgrad.backends.current()` returns."""

    NAME: str

    # -- what the callbacks call, in the order of a fit --------------------------
    def check_layers(self, model, layers):
        """Raises a ValueError naming a layer the model does not have, before anything is installed."""

    def is_chief(self, model):
        """Whether this worker writes the logs (the chief of a multi-worker strategy)."""

    def attach(self, model, role, config):
        """Installs the probing step for ``role`` (``"probe"``/``"guard"``); returns a `TrainingStep`."""

    def unprobed_train_function(self, model):
        """The function executions without a probed step run."""

    def detach(self, model, role):
        """Gives the model back what it had before `attach`."""

    def check_supported(self, role):
        """Raises `UnsupportedBackendError` if ``role`` (``"probe"``, ``"guard"``) cannot run here."""

    def check_dump(self, dump_dir):
        """Raises a ValueError, before anything is installed, where a trip's dump cannot be written here."""

    def replay_fields(self, model, batch, seeds_after):
        """``(born fields, note)``: where a tripped step's first NaN/Inf was born."""

    # -- public names whose meaning is the backend's own --------------------------
    ProbeTape: type
    ProbingModel: type
    ProbeResult: type
    # What `kgrad.tap` and `kgrad.prediction_gradient` call, with their arguments checked
    # (`kgrad.backends.common.public_functions` documents them once, for every backend).
    tap: typing.Callable
    prediction_gradient: typing.Callable
    first_non_finite: typing.Callable
    replay_step: typing.Callable
    value_and_grad: typing.Callable


#: The names every backend module defines.
BACKEND_NAMES = (
    "NAME", "check_supported", "check_layers", "is_chief", "attach", "unprobed_train_function", "detach",
    "check_dump", "replay_fields", "ProbeTape", "ProbingModel", "ProbeResult", "tap", "prediction_gradient",
    "first_non_finite", "replay_step", "value_and_grad",
)
