"""Which training steps the probe logs, and how many records one execution holds.

Backend-free and written once: the callbacks choose the train function of an
execution, the backends' steps test the step index (on the host, or in the
graph on a counter tensor) and size their record buffers, all from these rules.
Step ``i`` (counted from 0 since the start of ``fit``) is probed when
``every_n_steps`` divides it, so the first step of a fit is always probed.

``ProbeConfig.schedule`` gives a probe's schedule.

>>> schedule = ProbeSchedule(every_n_steps=4)
>>> [step for step in range(10) if schedule.probes(step)]
[0, 4, 8]
>>> schedule.probes_any(5, 7), schedule.probes_any(5, 8), schedule.record_capacity(steps_per_execution=6)
(False, True, 3)
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class ProbeSchedule:
    """The probe's schedule: one step in ``every_n_steps``, the first step of ``fit`` included.

    Args:
        every_n_steps: A positive int (`kgrad.GradientProbe`'s argument).

    Raises:
        ValueError: ``every_n_steps`` is not a positive int.
    """

    every_n_steps: int

    def __post_init__(self):
        every_n_steps = self.every_n_steps
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(
                f"`every_n_steps` must be a positive int. Received: every_n_steps={self.every_n_steps!r}."
            )

    def probes(self, step):
        """Whether step ``step`` is probed.

        ``step`` is a Python int, or an integer tensor or variable (a
        backend's step counter): the answer is then a boolean tensor, computed
        where the counter lives, with no host sync.
        """
        return step % self.every_n_steps == 0

    def probes_any(self, first_step, last_step):
        """Whether an execution that runs steps ``first_step`` to ``last_step`` (inclusive) probes one."""
        first_probed = -(-first_step // self.every_n_steps) * self.every_n_steps
        return first_probed <= last_step

    def probed_per_execution(self, steps_per_execution):
        """The most probed steps one execution of ``steps_per_execution`` steps can run."""
        return -(-steps_per_execution // self.every_n_steps)

    def record_capacity(self, steps_per_execution):
        """Records a device buffer holds: the probed steps of one execution, plus one.

        The extra slot keeps the previous execution's last record, which the
        non-finite guard reports as the last finite summaries.
        """
        return 1 + self.probed_per_execution(steps_per_execution)

