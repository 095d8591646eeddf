"""`NonFiniteGuard`: stop at the first NaN/Inf and say where it was born."""

import dataclasses
import functools
import os
import sys
import warnings

import keras

from kgrad import install
from kgrad.config import GuardConfig
from kgrad.guard import NonFiniteError
from kgrad.tensorboard import write_guard_report

_ACTIONS = ("stop", "warn", "raise")


class NonFiniteGuard(keras.callbacks.Callback):
    """Finds the first NaN/Inf of a training step, also under XLA.

    Keras' ``TerminateOnNaN`` sees the loss only; ``tf.debugging`` checks slow
    every step and do not work under ``jit_compile``. This guard checks every
    step, inside the compiled step, whether an input, activation, dJ/dŷ,
    dJ/d(activation) or weight gradient holds a NaN or Inf: one cheap
    reduction per tensor and one scalar flag, returned with the logs that
    Keras reads after each execution anyway. (dJ/dŷ, which the step does not
    compute for training, is computed and located on a bad step only: every
    NaN/Inf in it that can reach the weights trips the weight-gradient check
    first.) When a step goes non-finite, its update is **not applied**, and
    the guard reports the step, the first non-finite tensor in forward order
    (then backward, from the loss down), its layer, its NaN and Inf counts
    and its norm on the last finite step (plus the full summaries of that
    layer when a `kgrad.GradientProbe` runs alongside).

    Args:
        action: ``"stop"`` (stop training, keep the last finite weights),
            ``"warn"`` (warn, skip the bad update, go on) or ``"raise"``
            (raise `kgrad.NonFiniteError`, whose ``.report`` says where).
        watch: ``"all"`` or a subset of ``("inputs", "activations",
            "prediction_gradient", "activation_gradients",
            "weight_gradients")``; the loss is always checked.
            ``["weight_gradients"]`` is the cheapest guard that still keeps
            every non-finite update out of the weights (one reduction per
            weight): it lets through a NaN masked out before the loss or an
            Inf that saturates (``sigmoid(inf) == 1``), and reports the loss
            or a weight gradient rather than the layer where the bad value
            was born.
        layers: Layers whose activations and gradients are checked:
            ``None`` (every leaf layer with weights), ``"all"``, names, layer
            objects or a predicate.
        ignore_loss_scale_skips: Under mixed precision, a
            ``LossScaleOptimizer`` makes gradients overflow on purpose and
            skips those steps itself; by default only the forward pass is
            checked then, so expected skips do not stop training.
        log_dir: If given, each report is also written to ``<log_dir>/kgrad``
            (tag ``guard/report``, see `kgrad.tensorboard.write_guard_report`),
            where the kgrad tab of TensorBoard shows it.

    Attributes:
        report: The `kgrad.NonFiniteReport` of the first bad step, or ``None``.
        reports: Every report of this fit (several with ``action="warn"``).

    Example:

    >>> import keras, kgrad, numpy as np
    >>> model = keras.Sequential([keras.Input((2,)),
    ...     keras.layers.Dense(4, name="hidden"),
    ...     keras.layers.Lambda(lambda t: keras.ops.log(t), name="log"),
    ...     keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> guard = kgrad.NonFiniteGuard(layers="all")
    >>> _ = model.fit(np.ones((4, 2)), np.ones((4, 1)), callbacks=[guard], verbose=0)
    >>> guard.report.layer, guard.report.kind
    ('log', 'activation')
    """

    def __init__(self, action="stop", watch="all", layers=None, ignore_loss_scale_skips=True, log_dir=None):
        super().__init__()
        if action not in _ACTIONS:
            raise ValueError(
                f"`action` must be one of {list(_ACTIONS)}. Received: action={action!r}."
            )
        if not isinstance(ignore_loss_scale_skips, bool):
            raise TypeError(
                "`ignore_loss_scale_skips` must be True or False. Received: "
                f"ignore_loss_scale_skips={ignore_loss_scale_skips!r}."
            )
        self.action = action
        self.config = GuardConfig(
            layers=layers,
            watch=watch,
            ignore_loss_scale_skips=ignore_loss_scale_skips,
            halt_updates=action != "warn",
        )
        self.report = None
        self.reports = []
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self._step = None

    def on_train_begin(self, logs=None):
        self._step = install.attach(self.model, "guard", self.config)
        self.report = None
        self.reports = []

    def on_train_end(self, logs=None):
        install.detach(self.model, "guard")

    def on_train_batch_end(self, batch, logs=None):
        tripped = self._step.guard_tripped
        # The flag came back with the step's logs, which Keras has already
        # read from the device: testing it costs no device access.
        if tripped is None or not bool(tripped):
            return
        report = state = None
        # One state for the model, or one per ProbeTape of its own train_step.
        for tape, candidate in self._step.guard_states().items():
            report = candidate.read_report(functools.partial(self._latest_summaries, tape))
            if report is not None:
                state = candidate
                if tape is not None:  # a ProbeTape of the model's own train_step
                    report = dataclasses.replace(
                        report, layer=f"{tape}/{report.layer}", tensor=f"{report.kind}/{tape}/{report.layer}"
                    )
                break
        if report is None:
            return
        self.reports.append(report)
        self.report = self.report or report
        if self.log_dir is not None:
            write_guard_report(self.log_dir, report)
        if self.action == "warn":
            state.reset()
            warnings.warn(f"kgrad.NonFiniteGuard: {report}", RuntimeWarning, stacklevel=2)
            return
        self.model.stop_training = True
        if self.action == "raise":
            # Keras calls no on_train_end when a callback raises.
            install.detach(self.model, "guard")
            raise NonFiniteError(report)
        print(
            f"kgrad.NonFiniteGuard stopped training: {report} The weights are "
            "those of the last finite step.",
            file=sys.stderr,
        )

    def _latest_summaries(self, tape, layer, last_finite_step):
        """Summaries of ``layer`` (of ``tape``) from the latest probed step that was finite."""
        pipeline = self._step.pipelines().get(tape)
        state = None if pipeline is None else pipeline.state
        if state is None or last_finite_step is None:
            return {}
        records, _ = state.read_since(0)
        finite = [record for record in records if record.step <= last_finite_step]
        if not finite:
            return {}
        suffix = f"/{layer}"
        return {
            tag: value for tag, value in finite[-1].scalars.items() if tag.endswith(suffix)
        }
