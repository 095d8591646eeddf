"""`Traced`: one traced train function of a `ProbingStep`, its plan and the buffers it writes."""

import dataclasses

from kgrad.backends.common.batch_dump import BATCH_OUTPUT
from kgrad.backends.tensorflow.guard.watched import TRIPPED_OUTPUT
from kgrad.backends.tensorflow.handover.state import RECORD_OUTPUT

#: The key under which a step whose statistics run after it returns
#: ``(step, tensors to summarize)``; `ProbingStep.take_outputs` takes it out.
SUMMARY_INPUTS_OUTPUT = "kgrad_summary_inputs"


@dataclasses.dataclass
class Traced:
    """A traced function, the plan it was traced for, and the buffers it writes."""

    plan: object
    function: object
    pipeline: object = None
    guard_state: object = None
    # `kgrad.backends.tensorflow.guard.tripped_batch.TrippedBatch`, where variables hold the batch.
    tripped_batch: object = None
    compiled_step: object = None  # the step's own XLA function (`StepPlan.compiles_step_inside`)
    batch_not_kept: object = None  # why no batch is kept for the replay (`keep_tripped_batch`)
    tape_pipelines: dict = dataclasses.field(default_factory=dict)
    tape_guard_states: dict = dataclasses.field(default_factory=dict)
    # The model's `kgrad.backends.tensorflow.guard.tripped_batch.StepsInEpoch`, shared.
    steps_in_epoch: object = None


def by_name(traced, own, per_tape):
    """``{None: traced.<own>}`` if set, else ``traced.<per_tape>`` (one per ProbeTape)."""
    if traced is None:
        return {}
    if getattr(traced, own) is not None:
        return {None: getattr(traced, own)}
    return dict(getattr(traced, per_tape))


#: The keys of kgrad's entries in a train function's outputs.
KGRAD_OUTPUTS = (TRIPPED_OUTPUT, BATCH_OUTPUT, SUMMARY_INPUTS_OUTPUT, RECORD_OUTPUT)


def split_outputs(outputs):
    """``(Keras' outputs, kgrad's outputs)`` of a train function: Keras' logs must not show kgrad's."""
    keras_outputs = {key: value for key, value in outputs.items() if key not in KGRAD_OUTPUTS}
    return keras_outputs, {key: value for key, value in outputs.items() if key in KGRAD_OUTPUTS}
