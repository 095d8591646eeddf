"""The guard's collection: every differentiated part of a guarded JAX step checked.

Every guarded step (not only the probed ones) runs the model's step, its own
or Keras' own with its one part, with a `CheckedParts` active: each
`kgrad.value_and_grad` call in it (a "part": the generator, the
discriminator) is ``jax.value_and_grad`` (on a probed step, the probe's
`PartCollection` call, which it wraps) and hands its loss and gradients to
the guard: a clean step costs one sum of squares per tensor. Off probed steps
Keras' step's update runs behind the check (`CheckedParts.behind_check`; on
probed ones with the spike rule too, by a select: `_probed_update`); a
part of a model's own step is selected after the step (a later part sees the
update as the step computed it), except for the spike rule, which decides
each part inside its optimizer's update (`CheckedParts.judge_parts`). The
step recorded is the ``iterations`` of the optimizer that applied the first
part's gradients, before its update, as the probe logs it (each candidate
optimizer's ``stateless_apply`` is watched). A part's rows are named inside
its run (``loss/<part>``, ``weight_grad/<part>/<path>``); Keras' step's part,
of the run ``None``, adds no name (``loss/loss``).
"""

import functools

import jax
import jax.numpy as jnp

from kgrad.backends.common.calls import replaced_calls
from kgrad.backends.common.own_step import candidate_optimizers
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.capture.loss_scale import (
    loss_scale_of,
    skips_overflowed_steps,
    value_and_grad_noting_scale,
)
from kgrad.backends.jax.guard import overflow, spikes as spike_rule
from kgrad.backends.jax.guard.part_spikes import PartJudge
from kgrad.backends.jax.guard.sentinel import may_apply, tensor_checks
from kgrad.backends.jax.guard.watched import WatchedPass, decode
from kgrad.backends.jax.own_step.resolve import (
    PartResolver, as_returned, as_role, bind_differentiated, no_part_error, unapplied_error,
)
from kgrad.report.non_finite import name_in_part


class CheckedParts:
    """The losses and gradients of the `kgrad.value_and_grad` calls of one step, for the guard.

    Args:
        model: The model whose ``train_step`` runs.
        trainable: The trainable values of the step's ``state``.
        inner: The probe's `PartCollection` on a probed step (it differentiates), else ``None``.
        watch: The `GuardConfig` of a guard that watches more than the default
            (each part's activations, dJ/dŷ and dJ/d(activation), checked in its
            pass as `WatchedPass` checks Keras' step), else ``None``.
        ignore_loss_scale_skips: A part whose loss a ``LossScaleOptimizer``
            scaled has only its loss checked: its overflowing gradients are how
            the scale is found (the optimizer skips those steps itself).
        judges_spikes: The spike rule judges the parts (a loss scaler's gradients: `overflow`).

    Attributes:
        names: Per part, ``"loss/<part>"`` and ``"weight_grad/<part>/<weight path>"`` per
            gradient; with ``watch``, its ``activation/<part>/<layer>`` before the loss
            and its ``pred_grad/<part>/…`` and ``grad/<part>/<layer>`` after it.
        tensors: The loss and gradient tensors among ``names``, in order: of the true
            loss (a loss scale divided back out).
        step: The ``iterations`` of the optimizer that applied the first part (``None``: none did).
    """

    def __init__(self, model, trainable, inner=None, watch=None, ignore_loss_scale_skips=True,
                 judges_spikes=False):
        self._model, self._inner, self._watch = model, inner, watch
        self._ignore_loss_scale_skips, self._judges_spikes = ignore_loss_scale_skips, judges_spikes
        self._rows = []  # ("tensors", count) or ("rows", (squares, counts)), in the order of `names`
        self._behind_check = None  # (record, halt_updates, spike rule, compiled), see `behind_check`
        self._checked = None  # (rows counted, checks) of the latest `checks`
        self._decided = None  # (rows counted, (apply, ids of the values it chose, spike decision))
        self._deciding = False
        self._update_behind_check = False  # the latest part's role allows it
        self._resolver = PartResolver(model, trainable)
        self._first = None  # ids of the first part's weight values
        self.part_judge = PartJudge(model)  # the own step's parts, see `judge_parts`
        self._optimizers = candidate_optimizers(model)
        self.names, self.tensors, self.step = [], [], None
        self._owned, self._update_scale = (), None  # a loss scaler's tensors (`overflow`); 1 / the last scale

    def __enter__(self):
        watched = [(optimizer, functools.partial(self._watched, optimizer)) for optimizer in self._optimizers]
        self._watching = replaced_calls(watched, method="stateless_apply")
        self._watching.__enter__()
        return self

    def __exit__(self, *exc_info):
        self._watching.__exit__(None, None, None)

    def behind_check(self, record, halt_updates, spikes=None, compiled=True, sampling=False):
        """Puts an optimizer update behind the check of the rows kept so far (a ``lax.cond``).

        Only that of a part whose role allows it (Keras' own step's; the spike
        rule's would-be update, computed while deciding, is not watched).

        A clean step then costs no select over what the update wrote: the
        optimizer writes in place (on a 400k-weight MLP on CPU, ~0.04 of a step
        against ~0.2 with a ``jnp.where`` per leaf of weights and Adam's
        moments). The step's state is still selected after the step where a
        part was checked after the update (its choice is the whole step's).
        ``spikes``: the spike rule (Keras' own step), its skip decided in the
        same branch. Eagerly (``compiled`` false) a ``lax.cond`` would compile
        the update, rounding unlike Keras' eager one: only the spike rule's
        choice is made there, by a select. ``sampling``: a sample step (the update
        measured for the spike rule's samples, `spikes.sample_measure`).
        """
        if compiled or spikes is not None:
            self._behind_check = (record, halt_updates, spikes, compiled, sampling)
        return self

    def judge_parts(self, records, halt_updates, rule, compiled=True, sampling=False):
        """Judges each part of a model's own step by the spike rule, inside its optimizer's update.

        When a part's gradients are applied (its optimizer's ``stateless_apply``,
        called by the ``train_step``), its loss and gradients are judged against
        its own window (``records``, one `SpikeRecord` per part) and a spiking
        part's ``stateless_apply`` returns the weights and optimizer variables
        it was given (a ``lax.cond``): the later parts of the step see the
        values of before, as on TensorFlow, where the tape's update is skipped
        inside ``apply``. ``part_judge.decisions()`` gives each part's decision.
        ``sampling``: a sample step (as `behind_check`'s).
        """
        self.part_judge.judge(records, halt_updates, rule, compiled, sampling)
        return self

    def around(self, parts):
        """Itself, differentiating through the probe's `PartCollection` ``parts`` (a probed step)."""
        self._inner = parts
        return self

    def value_and_grad(self, fn, argnums, has_aux, name, args, kwargs):
        """`kgrad.value_and_grad(fn, argnums, has_aux, name)(*args, **kwargs)`; keeps what it returns.

        ``name``: the user's, or a `PartRole` (Keras' own step's: its rows carry no part name).
        """
        role = as_role(name)
        self._update_behind_check = role.update_behind_check
        resolved = self._resolver.resolve(argnums, args, role.model)
        owner, leaves, indices = resolved.owner, resolved.leaves, resolved.indices
        part = role.run(self._resolver, resolved)  # the probe's run name for the same call
        call, values = bind_differentiated(fn, resolved.numbers, args, kwargs)
        watched, watch = None, None
        scaler, inverse_scale = role.scaler, role.inverse_scale
        if self._inner is None and self._watch is None:
            if role.scale_known:
                grad_fn = jax.value_and_grad(call, argnums=tuple(range(len(values))), has_aux=has_aux)
                result, gradients = grad_fn(*values)
            else:  # the loss scale, if any, is noted in the pass itself: the checks come after it
                result, gradients, scaler, inverse_scale = value_and_grad_noting_scale(
                    call, values, has_aux, self._optimizers, role.name or owner.name
                )
            gradients = as_returned(argnums, gradients)
        elif not role.scale_known:
            # The probe's pass, or the watched gradients' checks inside it, need the scale before.
            name = role.name or owner.name
            scaler, inverse_scale = loss_scale_of(call, values, has_aux, self._optimizers, name)
        checks_gradients = not (self._ignore_loss_scale_skips and skips_overflowed_steps(scaler))
        owned = not checks_gradients and self._judges_spikes  # the spike rule's tensors, never checked
        if self._watch is not None:
            watch = WatchedPass(owner, self._watch, checks_gradients)
        if self._inner is not None:  # a probed step: the probe's pass checks the watched tensors too
            result, gradients, watched = self._inner.watched_value_and_grad(
                fn, argnums, has_aux, name, args, kwargs, watch
            )
        elif watch is not None:
            result, gradients, watched = watch.part_value_and_grad(call, values, has_aux, role, inverse_scale)
            gradients = as_returned(argnums, gradients)
        if self._first is None:
            self._first = {id(leaf) for leaf, index in zip(leaves, indices) if index is not None}
        kept = jax.tree_util.tree_leaves(gradients) if checks_gradients or owned else []
        if not role.update_behind_check:  # a part of a model's own step: judged where it is applied
            self.part_judge.add(part, len(self.tensors), len(kept), leaves, resolved.weights, resolved.paths,
                                inverse_scale, owned)
        self._keep(part, role.logged_loss(result), result[0] if has_aux else result, kept, resolved.paths,
                   inverse_scale, watched)
        self._update_scale = inverse_scale  # Keras' step's, for its update behind the check
        self._owned += tuple(range(len(self.tensors) - len(kept), len(self.tensors))) if owned else ()
        return result, gradients

    def _keep(self, part, loss, value, gradients, paths, inverse_scale, watched):
        """Keeps a part's rows: its loss, its watched tensors' rows, its gradients (of the true loss)."""
        named = (lambda name: name) if part is None else (lambda name: name_in_part(name, part))
        if inverse_scale is not None:  # the true loss and its gradients; a NaN stays NaN, an overflow Inf
            gradients = [gradient.astype(jnp.float32) * inverse_scale for gradient in gradients]
            if loss is None:
                loss = value.astype(jnp.float32) * inverse_scale
        tensors = [value if loss is None else loss] + gradients
        names = [f"loss/{'loss' if part is None else part}"]
        names += [named(f"weight_grad/{path}") for path in paths[: len(gradients)]]
        if watched is None:
            self._rows.append(("tensors", len(tensors)))
        else:
            (before_names, before), (after_names, after) = watched
            names = [named(n) for n in before_names] + names[:1] + [named(n) for n in after_names] + names[1:]
            self._rows += [("rows", decode(before)), ("tensors", 1), ("rows", decode(after)),
                           ("tensors", len(tensors) - 1)]
        self.names += names
        self.tensors += tensors

    def checks(self):
        """``(squares, counts)`` of every row of `names`, in order (the tensors behind one branch)."""
        if self._checked is not None and self._checked[0] == len(self._rows):
            return self._checked[1]
        squares, counts = tensor_checks(self.tensors, self._owned)
        pieces, start = [], 0
        for kind, item in self._rows:
            if kind == "rows":
                pieces.append(item)
            else:
                pieces.append((squares[start : start + item], counts[start : start + item]))
                start += item
        checks = jnp.concatenate([p[0] for p in pieces]), jnp.concatenate([p[1] for p in pieces])
        self._checked = (len(self._rows), checks)
        return checks

    def _watched(self, optimizer, stateless_apply):
        iterations, accumulation = keras_internals.iterations_position(optimizer)

        def watched_stateless_apply(optimizer_variables, grads, trainable_variables):
            applied = {id(value) for value in trainable_variables}
            if self.step is None and self._first is not None and self._first <= applied:
                self.step = optimizer_variables[iterations] // accumulation  # Keras' `iterations`
            part = None if self._deciding else self.part_judge.applied_part(optimizer, trainable_variables)
            if self.part_judge.judges(part):  # a part of a model's own step, judged by the spike rule
                self._deciding = True
                try:
                    probed_apply = self._probed_update(stateless_apply)
                    return self.part_judge.update(part, self.tensors, probed_apply or stateless_apply,
                                                  optimizer_variables, grads, trainable_variables,
                                                  selected=probed_apply is not None)
                finally:
                    self._deciding = False
            if self._behind_check is None or self._deciding or not self._update_behind_check:
                return stateless_apply(optimizer_variables, grads, trainable_variables)
            self._deciding = True
            try:
                return self._checked_apply(stateless_apply, optimizer_variables, grads, trainable_variables)
            finally:
                self._deciding = False
        self._update_behind_check = False  # the latest part's role allows it

        return watched_stateless_apply

    def _checked_apply(self, stateless_apply, optimizer_variables, grads, trainable_variables):
        """``stateless_apply``'s result if the rows so far are clean (and no spike), else the values."""
        record, halt_updates, rule, compiled, sampling = self._behind_check
        squares, counts = self.checks()
        apply, skip_table, judged, sample = may_apply(counts, record, halt_updates), None, None, None
        gradient_squares = squares[len(squares) - (len(self.tensors) - 1):]
        overflowed = overflow.overflowed(gradient_squares, self._owned)
        if rule is not None:  # a spiking step is kept out as a non-finite one is
            judged = spike_rule.judge(record.spikes, rule, self.tensors[0], gradient_squares,
                                      overflow.gradients_finite(counts, overflowed))
            veto = judged[1] | record.spikes.tripped if halt_updates else judged[1]
            apply = apply & jnp.logical_not(veto)
            # The skip's table in the skipped branch: the update's then writes in place.
            skip_table = functools.partial(spike_rule.table_if_new_spike, self._model, judged, record.spikes,
                                           inverse_scale=self._update_scale)
            sample = None if not sampling else spike_rule.sample_measure(
                self._model, inverse_scale=self._update_scale)
        probed_apply = self._probed_update(stateless_apply)
        (trainable, optimizer_variables), table, sampled = spike_rule.update_unless_skipped(
            apply, probed_apply or stateless_apply, optimizer_variables, grads, trainable_variables,
            compiled and probed_apply is None, skip_table, sample=sample,
        )
        chosen = {id(value) for value in [*trainable, *optimizer_variables]}
        spiked = None if judged is None else (judged, table, sampled, overflowed)
        self._decided = (len(self._rows), (apply, chosen, spiked))
        return trainable, optimizer_variables

    def _probed_update(self, stateless_apply):
        """On a probed step, ``stateless_apply`` noting its result for the probe, else ``None``.

        The probe (which wraps this update) measures what the update computed: the update then
        runs unconditionally and a select keeps the values of before where it is skipped (as
        eagerly), not a ``lax.cond``, whose skipped branch would not compute the optimizer's new
        moments. The probe logs the weights the step kept (a skipped step's update ratio is 0,
        as on TensorFlow) and the moments as computed (`PartCollection.computing`).
        """
        return None if self._inner is None else self._inner.computing(stateless_apply)

    def final_decision(self):
        """``(apply, ids of the values chosen, (judged, table, sample) or None)`` of the last update behind
        the check, if no row was kept after it (its choice is then the whole step's), else ``None``."""
        if self._decided is None or self._decided[0] != len(self._rows):
            return None
        return self._decided[1]

    def checked_step(self):
        """The step to record; raises when no optimizer applied the first part's gradients."""
        if not self.names:
            raise no_part_error("NonFiniteGuard", self._model, "check", "same arguments, or remove the guard")
        if self.step is None:  # the first part's
            part, unknown = self.names[0][len("loss/"):], "the step of a trip"
            raise unapplied_error("NonFiniteGuard", self._model, part, unknown, self._optimizers)
        return self.step
