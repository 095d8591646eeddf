"""`ProbingModel`: a `keras.Model` whose ``train_step`` captures inside its tape."""

import keras

from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.common import attached
from kgrad.backends.common.functional_base import BuiltFunctionally
from kgrad.plan.options import ProbeConfig
from kgrad.backends.tensorflow.differentiate.step_plan import StepPlan
from kgrad.backends.tensorflow.differentiate.prebuild import BuiltBeforeTracing
from kgrad.backends.tensorflow.differentiate.step import ProbingStep


@keras.saving.register_keras_serializable(package="kgrad")
class ProbingModel(BuiltFunctionally, keras.Model):
    """A ``keras.Model`` that probes gradients inside its own ``train_step``.

    Use it as a base class for a subclassed model, or build it functionally
    like ``keras.Model(inputs, outputs)``. Training is exactly Keras' own
    ``train_step``; on probed steps the same tape also captures activations,
    dJ/d(activation), dJ/dŷ, dJ/dx and the weight gradients, summarized on
    device. Configure what is captured with `configure_probe`; read the latest
    summaries with `probe_results`, or pass a `kgrad.GradientProbe` to ``fit``
    to log them to TensorBoard.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> inputs = keras.Input((4,))
    >>> hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    >>> outputs = keras.layers.Dense(1, name="out")(hidden)
    >>> model = kgrad.ProbingModel(inputs, outputs)
    >>> model.configure_probe(layers=["hidden"], every_n_steps=2)
    >>> model.compile("sgd", "mse")
    >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 1)), batch_size=4, verbose=0)
    >>> record = model.probe_results
    >>> record.step, round(record.scalars["activation_zero_fraction/hidden"], 2) >= 0
    (0, True)
    """

    # Read by `kgrad.backends.common.own_step.has_own_train_step`: this
    # class's train_step is kgrad's, not a train_step of the user's own.
    _kgrad_probing_model = True

    def configure_probe(self, **options):
        """Sets what the probe captures; see `kgrad.GradientProbe` for options.

        Args:
            **options: ``layers``, ``every_n_steps``, ``capture``,
                ``histograms``, ``bucket_count``, ``statistics``
                (``"default"`` or ``"all"``), ``instruments``
                (``["per_example", "optimizer", "logits", "attention"]``),
                ``outlier_sigmas``, ``attention_examples``.
        """
        attached.put(self, "probe_config", ProbeConfig(**options))
        self._set_probing_step(ProbingStep(self))
        self.train_function = None

    @property
    def probe_config(self):
        """The `kgrad.plan.options.ProbeConfig` set by `configure_probe` (or the default)."""
        return attached.get(self, "probe_config") or ProbeConfig()

    def _set_probing_step(self, step):
        # Untracked (`attached`): the probe's variables must stay out of the
        # model's weights (and out of saved models).
        attached.put(self, "probing_step", step)

    def _probing_step(self):
        if attached.get(self, "probing_step") is None:
            self._set_probing_step(ProbingStep(self))
        return attached.get(self, "probing_step")

    def make_train_function(self, force=False):
        step = self._probing_step()
        step.prepare()
        if self.train_function is not None and not force:
            return self.train_function
        if attached.get(self, "installation") is not None:
            # A kgrad callback is attached: its train function chose the plan.
            super().make_train_function(force=True)
            return self.train_function

        def make_function():
            super(ProbingModel, self).make_train_function(force=True)
            # Keras builds the optimizer and metrics in the first trace, which
            # makes the probing step trace twice: built first, it traces once.
            return BuiltBeforeTracing(self, self.train_function)

        plan = StepPlan(
            probe=self.probe_config,
            steps_per_execution=self.steps_per_execution,
            replicas=self.distribute_strategy.num_replicas_in_sync,
        )
        self.train_function = step.function_for(plan, make_function).function
        return self.train_function

    def train_step(self, data):
        return self._probing_step().train_step(data)

    @property
    def probe_results(self):
        """The latest probed step as a `kgrad.ProbeRecord`, or ``None``.

        Reading it copies the summaries from device memory (a host sync).
        """
        state = self._probing_step().state
        if state is None:
            return None
        records, _ = state.read_since(max(0, int(state.written.numpy()) - 1))
        return records[-1] if records else None


@keras.saving.register_keras_serializable(package="kgrad")
class FunctionalProbingModel(ProbingModel, keras_internals.Functional):
    """What ``kgrad.ProbingModel(inputs, outputs)`` returns.

    As ``keras.Model(inputs, outputs)`` returns a ``Functional``. Not public:
    test ``isinstance(model, kgrad.ProbingModel)``.
    """


# `kgrad.ProbingModel(inputs, outputs)` is a `FunctionalProbingModel` (common/functional_base.py).
ProbingModel._functional_pair = (ProbingModel, FunctionalProbingModel)
