"""`ProbingModel` on JAX: a `keras.Model` whose train function probes Keras' own ``train_step``."""

import keras

from kgrad.backends import UnsupportedBackendError
from kgrad.backends.common import attached
from kgrad.backends.common.functional_base import BuiltFunctionally
from kgrad.backends.common.own_step import has_own_train_step
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.differentiate.install import probing_train_function
from kgrad.backends.jax.handover.train_function import TrainFunction
from kgrad.plan.options import ProbeConfig


@keras.saving.register_keras_serializable(package="kgrad")
class ProbingModel(BuiltFunctionally, keras.Model):
    """A ``keras.Model`` that probes gradients inside its own training step, on JAX.

    Use it as a base class for a subclassed model, or build it functionally
    like ``keras.Model(inputs, outputs)``. Training is exactly Keras' own
    ``train_step``; on probed steps the same backward pass also gives the
    statistics of activations, dJ/d(activation), dJ/dŷ, dJ/dx and the weight
    gradients, on device, as `kgrad.GradientProbe` does. Configure what is
    captured with `configure_probe`; read the latest probed step with
    `probe_results` (a host read), or pass a `kgrad.GradientProbe` to ``fit``
    to log to TensorBoard (while it is attached, its options are used).

    Example:

    >>> import keras, kgrad, numpy as np
    >>> inputs = keras.Input((4,))
    >>> hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    >>> model = kgrad.ProbingModel(inputs, keras.layers.Dense(1, name="out")(hidden))
    >>> model.configure_probe(layers=["hidden"], every_n_steps=2)
    >>> model.compile("sgd", "mse")
    >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 1)), batch_size=4, verbose=0)
    >>> record = model.probe_results
    >>> record.step, 0 <= record.scalars["activation_zero_fraction/hidden"] <= 1
    (0, True)
    """

    def configure_probe(self, **options):
        """Sets what the probe captures; see `kgrad.GradientProbe` for the options.

        Args:
            **options: ``layers``, ``every_n_steps``, ``capture``,
                ``histograms``, ``bucket_count``, ``statistics``.
        """
        attached.put(self, "probe_config", ProbeConfig(**options))
        attached.pop(self, "probing_function")  # traced for the old options
        attached.pop(self, "latest_record")
        self.train_function = None

    @property
    def probe_config(self):
        """The `kgrad.plan.options.ProbeConfig` set by `configure_probe` (or the default)."""
        return attached.get(self, "probe_config") or ProbeConfig()

    def make_train_function(self, force=False):
        if isinstance(self.train_function, TrainFunction) and not force:
            return self.train_function
        if attached.get(self, "installation") is not None:  # a kgrad callback's function chose the options
            return super().make_train_function(force)
        if has_own_train_step(self):
            raise UnsupportedBackendError(
                f"kgrad.ProbingModel '{self.name}' (class {type(self).__name__}) defines its own "
                "train_step; on JAX a ProbingModel probes Keras' own train_step. In a train_step of "
                "your own, subclass keras.Model, replace `jax.value_and_grad(...)` with "
                "`kgrad.value_and_grad(...)` and pass kgrad.GradientProbe(...) to fit."
            )
        if force or self.train_function is None:
            super().make_train_function(force=True)
        function = attached.get(self, "probing_function")
        if function is None or function.keras_train_function is not self.train_function:
            function = probing_train_function(self, self.probe_config, self.train_function)
            # Nothing reads the records but `probe_results`: keep the latest only.
            function.buffers[None].keep_latest_only()
            attached.put(self, "probing_function", function)
        # Continue counting where the optimizer is (a later fit): probed steps are every n-th.
        function.start_at(int(self.optimizer.iterations.numpy()) if self.optimizer.built else 0)
        self.train_function = function
        return function

    @property
    def probe_results(self):
        """The latest probed step as a `kgrad.ProbeRecord`, or ``None``.

        Reading it copies the summaries from device memory (a host sync).
        """
        function = attached.get(self, "probing_function")
        if function is not None:
            records, _ = function.buffers[None].read_since(0)
            if records:
                attached.put(self, "latest_record", records[-1])
        return attached.get(self, "latest_record")


@keras.saving.register_keras_serializable(package="kgrad")
class FunctionalProbingModel(ProbingModel, keras_internals.Functional):
    """What ``kgrad.ProbingModel(inputs, outputs)`` returns on JAX (not public: test ``isinstance``)."""


# `kgrad.ProbingModel(inputs, outputs)` is a `FunctionalProbingModel` (common/functional_base.py).
ProbingModel._functional_pair = (ProbingModel, FunctionalProbingModel)
