"""What a traced TensorFlow probing step computes, chosen once before it is traced.

TensorFlow's alone: the JAX backend keeps its train functions by their
`kgrad.plan.options.ProbeConfig`.
"""

import dataclasses

from kgrad.plan.options import GuardConfig, ProbeConfig


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One immutable description of a probing step; the key of its traced function.

    Everything that changes the graph of a probing step is here, so that a
    step traced for one plan is never run for another, and a later ``fit``
    with the same plan reuses the traced function.

    Args:
        probe: The `ProbeConfig` of the summaries, or ``None`` for none.
        guard: The `GuardConfig` of the finite check, or ``None`` for none.
        steps_per_execution: The model's ``steps_per_execution``.
        probed_steps_only: The function runs only probed steps (a
            `GradientProbe` runs Keras' own function for the others): no
            schedule and no branch in it.
        records_in_outputs: The step returns the record it wrote with its
            outputs (`kgrad.backends.tensorflow.handover.state.RECORD_OUTPUT`) when it probes every step.
        statistics_after_step: Under XLA, a step that probes every step
            returns the tensors to summarize and the statistics run after it
            (see `kgrad.backends.tensorflow.summarize.pipeline.ProbePipeline.summarize_after_step`).
        replicas: Replicas in sync of the model's distribution strategy.
        compiles_step_inside: Under XLA, the step compiles its own body
            (``tf.function(jit_compile=True)``) inside a loop Keras does not
            compile: with a guard and several steps per execution, so that
            the tripped step's batch, whose size XLA cannot write into a
            variable, is kept outside the compiled body.

    Example:

    >>> from kgrad.plan.options import ProbeConfig
    >>> plan = StepPlan(probe=ProbeConfig(every_n_steps=10), steps_per_execution=32)
    >>> plan.probes_every_step, plan.record_capacity
    (False, 5)
    """

    probe: ProbeConfig = None
    guard: GuardConfig = None
    steps_per_execution: int = 1
    probed_steps_only: bool = False
    records_in_outputs: bool = False
    statistics_after_step: bool = False
    replicas: int = 1
    compiles_step_inside: bool = False

    def __post_init__(self):
        if self.probe is not None and not isinstance(self.probe, ProbeConfig):
            raise TypeError(f"`probe` must be a ProbeConfig or None. Received: probe={self.probe!r}.")
        if self.guard is not None and not isinstance(self.guard, GuardConfig):
            raise TypeError(f"`guard` must be a GuardConfig or None. Received: guard={self.guard!r}.")

    @property
    def probes_every_step(self):
        """Whether every step the function runs is probed (no branch needed)."""
        return self.probe is not None and (self.probed_steps_only or self.probe.every_n_steps == 1)

    @property
    def records_layer_inputs(self):
        """Whether the tape keeps its layers' inputs (``instruments=["per_example"]``)."""
        return self.probe is not None and "per_example" in self.probe.instruments

    @property
    def records_attention(self):
        """Whether the tape keeps the attention layers' q and k (``instruments=["attention"]``)."""
        return self.probe is not None and "attention" in self.probe.instruments

    @property
    def defers_statistics(self):
        """Whether the step returns its tensors for the statistics to run after it."""
        return (
            self.statistics_after_step
            and self.guard is None
            and self.probes_every_step
            and self.replicas == 1
        )

    @property
    def record_capacity(self):
        """Records the device buffer holds (`kgrad.plan.schedule.ProbeSchedule.record_capacity`), or 0."""
        if self.probe is None:
            return 0
        return self.probe.schedule.record_capacity(self.steps_per_execution)
