"""The spike rule on each part of a model's own JAX ``train_step``, decided inside its update.

A part (a `kgrad.value_and_grad` call: a GAN's discriminator, its generator)
is judged on its own loss and gradients against its own window (one
`kgrad.backends.jax.guard.spikes.SpikeRecord` per part), when its optimizer's
``stateless_apply`` is called with its gradients (the ``train_step`` calls it,
`kgrad.backends.jax.guard.checked_parts.CheckedParts` watches it): a spiking
part's ``stateless_apply`` returns the weights and optimizer variables it was
given, so the parts after it in the step see its values of before, as on
TensorFlow, where a tape's update is skipped inside ``apply``.

Example:

>>> part = OwnStepPart(0, "discriminator", loss_index=0, checked=2, ids=[1, 2], weights=[], paths=["k", "b"])
>>> (part.name, part.applied)
('discriminator', False)
"""

import functools

import jax.numpy as jnp

from kgrad.backends.jax.guard import overflow, spikes as spike_rule
from kgrad.backends.jax.guard.sentinel import tensor_checks


class OwnStepPart:
    """A part of a model's own step, as the spike rule judges it.

    Args:
        number: Its position among the step's parts (and its `SpikeRecord`'s).
        name: Its run name.
        loss_index: Its loss's position in `CheckedParts.tensors` (its checked gradients follow).
        checked: How many of its gradients are checked.
        ids: The ids of its differentiated values, in order.
        weights: Their model variables.
        paths: The checked gradients' weight paths.

    Attributes:
        applied: Whether an optimizer's ``stateless_apply`` applied its gradients.
        optimizer: That optimizer.
    """

    def __init__(self, number, name, loss_index, checked, ids, weights, paths):
        self.number, self.name, self.loss_index, self.checked = number, name, loss_index, checked
        self.ids, self.weights, self.paths = ids, weights, paths
        self.applied, self.optimizer = False, None


class PartJudge:
    """The own step's parts of one guarded step, and the spike rule's decision for each.

    Args:
        model: The model whose ``train_step`` runs.

    Attributes:
        parts: The `OwnStepPart`s, in the order the step differentiated them.
    """

    def __init__(self, model):
        self._model = model
        self._judging = None  # (records, halt_updates, rule, compiled, sampling), see `judge`
        self._decisions = {}  # part number -> (judged, table, sample, apply)
        self.parts = []

    def judge(self, records, halt_updates, rule, compiled=True, sampling=False):
        """Judges each part inside its update (``records``: one `SpikeRecord` per part; ``sampling``:
        a sample step, each part's update measured for its samples)."""
        self._judging = (records, halt_updates, rule, compiled, sampling)

    def add(self, name, loss_index, checked, leaves, weights, paths, inverse_scale=None, owned=False):
        """Notes a part (its loss at ``loss_index`` of the step's tensors, ``checked`` gradients after it).

        ``inverse_scale``: 1 / its loss scale (``None``: none); ``owned``: its checked gradients
        are a loss scaler's, which skips their overflow itself (`overflow`).
        """
        ids = [id(leaf) for leaf in leaves]
        part = OwnStepPart(len(self.parts), name, loss_index, checked, ids, weights, paths[:checked])
        part.inverse_scale, part.owned = inverse_scale, owned
        self.parts.append(part)

    def applied_part(self, optimizer, trainable_variables):
        """The latest part not yet applied whose values these are (noting ``optimizer``), or ``None``."""
        applied = [id(value) for value in trainable_variables]
        for part in reversed(self.parts):
            if not part.applied and part.ids == applied:
                part.applied, part.optimizer = True, optimizer
                return part
        return None

    def judges(self, part):
        """Whether ``part`` (an `applied_part`) is judged: a part, and the spike rule on."""
        return part is not None and self._judging is not None

    def update(self, part, tensors, stateless_apply, optimizer_variables, grads, trainable, selected=False):
        """``stateless_apply``'s ``(trainable, optimizer variables)``, or those given if ``part`` spikes.

        ``tensors``: `CheckedParts.tensors` (the part's loss and gradients among
        them); ``stateless_apply``: the optimizer's own, and its arguments.
        ``selected``: the update runs and a select chooses, no ``lax.cond`` (a
        probed step, whose probe measures the update as computed).
        """
        records, halt_updates, rule, compiled, sampling = self._judging
        spikes = records[part.number]
        checked = tensors[part.loss_index + 1 : part.loss_index + 1 + part.checked]
        # Counts only where a sum is not finite; none of a loss scaler's (`overflow.overflowed`).
        squares, counts = tensor_checks(checked, range(len(checked)) if part.owned else ())
        overflowed = overflow.overflowed(squares, part.owned)
        judged = spike_rule.judge(spikes, rule, tensors[part.loss_index], squares,
                                  overflow.gradients_finite(counts, overflowed))
        veto = judged[1]
        if halt_updates:  # a streak of any part stopped training: no part's update is applied
            veto = veto | jnp.any(jnp.stack([record.tripped for record in records]))
        skip_table = functools.partial(
            spike_rule.table_if_new_spike, self._model, judged, spikes, optimizer=part.optimizer,
            weights=part.weights, inverse_scale=part.inverse_scale,
        )
        apply = jnp.logical_not(veto)
        measure = None if not sampling else spike_rule.sample_measure(
            self._model, part.optimizer, part.weights, part.inverse_scale
        )
        values, table, sampled = spike_rule.update_unless_skipped(
            apply, stateless_apply, optimizer_variables, grads, trainable, compiled and not selected,
            skip_table, part.checked,
            sample=measure,
        )
        self._decisions[part.number] = (judged, table, sampled, overflowed, apply)
        return values

    def decisions(self):
        """Per part: ``(judged, table, sample, overflowed or None, apply)`` of its judged update."""
        return [self._decisions[part.number] for part in self.parts]


def require_every_part_applied(model, parts):
    """Raises, naming them, when some `OwnStepPart`s were not applied as one update each."""
    unapplied = [part.name for part in parts if not part.applied]
    if unapplied:
        raise ValueError(
            f"kgrad.NonFiniteGuard(skip_spikes=True): the gradients of part(s) {unapplied} of the "
            f"train_step of model '{model.name}' were not applied by one "
            "optimizer.stateless_apply(optimizer_variables, grads, values) whose values are the "
            "part's differentiated values, in the same order, so a spiking part's update cannot be "
            "skipped as one update. Apply each kgrad.value_and_grad's gradients in one "
            "stateless_apply call of an optimizer that is an attribute of the model, or pass "
            "skip_spikes=False."
        )


def recorded(rule, records, decisions, step_applied):
    """Each part's `SpikeRecord` after the step (``step_applied``: no NaN kept the whole step out)."""
    return tuple(
        spike_rule.record_step(rule, record, judged, table, sampled, overflowed, applied & step_applied)
        for record, (judged, table, sampled, overflowed, applied) in zip(records, decisions)
    )


def rearmed(spikes):
    """A `SpikeRecord` whose reported streak is judged afresh."""
    return spikes._replace(tripped=jnp.asarray(False), streak=jnp.zeros_like(spikes.streak))


class PartSpikes:
    """The spike state of one part, as `kgrad.NonFiniteGuard` reads it (`GuardRun.guard_states`).

    Its non-finite checks are the `GuardRun`'s (one report for the step): only its spikes are its own.
    """

    def __init__(self, run, number):
        self._run, self._number = run, number

    def read_spikes(self, optimizer):
        return self._run.read_part_spikes(self._number)

    def read_report(self, last_summaries_for):
        return None

    def reset(self, everything=False):
        pass  # the `GuardRun` (also in `guard_states`) re-arms every part
