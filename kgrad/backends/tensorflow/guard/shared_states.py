"""The guard's device variables of one probing step, shared by all its traced functions."""

from kgrad.backends.tensorflow.guard.sentinel import GuardState
from kgrad.backends.tensorflow.handover import replicas


class SharedGuardStates:
    """The `GuardState`s of one probing step, shared by all its traced functions.

    A `GradientProbe` with a `NonFiniteGuard` runs the guard-only function
    for executions without a probed step and the probing function for the
    others: both check the same tensors, so they share one trip flag and
    one "last finite step".

    Args:
        model: The model, whose distribution strategy creates the variables.
    """

    def __init__(self, model):
        self._model = model
        self._states = {}

    def get(self, tape_name, names, on_trip_only, spikes=None, scaler_owned=()):
        """The state for ``names`` of a tape (``None``: the model's own), made on first use (in a trace)."""
        key = (tape_name, tuple(names), frozenset(on_trip_only), spikes, frozenset(scaler_owned))
        if key not in self._states:
            self._states[key] = replicas.create_variables(
                self._model, lambda: GuardState(names, on_trip_only, spikes, scaler_owned)
            )
        return self._states[key]

    def reset(self, everything=False):
        """`GuardState.reset` of every state."""
        for state in self._states.values():
            state.reset(everything)
