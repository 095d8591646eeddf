"""The guard's ``watch=`` beyond the default on JAX: inputs, activations and their gradients, every step.

`WatchedPass` runs Keras' loss and its one backward pass (what
``JAXTrainer.train_step`` differentiates) with the chosen layers' outputs
tapped, as the probe taps them (`kgrad.backends.jax.capture`): each watched
forward tensor (a float input, a layer's output) gives its check row where it
is made, and each watched gradient (dJ/dŷ, dJ/d(activation)) through a
carrier whose cotangent is that row, so nothing the size of an activation is
kept. A check row is the sum of squares (non-finite whenever an element is
NaN or Inf) and, only when that sum is not finite (a ``lax.cond``), the NaN
and Inf counts (`kgrad.backends.jax.guard.sentinel.non_finite_counts`, on the
host). The rows come in TensorFlow's order
(`kgrad.backends.tensorflow.guard.watched`): inputs and activations, then
(after the loss) dJ/dŷ and dJ/d(activation) from the loss down; the sentinel
puts the loss and the weight gradients in their places.

Example:

>>> import jax.numpy as jnp
>>> squares, counts = decode(check_row(jnp.array([3.0, jnp.nan, jnp.inf, 4.0]))[None])
>>> bool(jnp.isnan(squares[0])), counts.tolist()
(True, [[1, 1]])
"""

import dataclasses

import jax
import jax.numpy as jnp

from kgrad.backends.common.model_io import float_input_names
from kgrad.backends.jax.capture.carriers import tap_gradient
from kgrad.backends.jax.capture.taps import KeyedTaps, intercept, trace_taps
from kgrad.backends.jax.guard.sentinel import non_finite_counts
from kgrad.plan import selection
from kgrad.plan.tag_names import io_names

# A count is carried as float32 (a cotangent) in two parts, each below 2**24: exact to int32's 2**31.
_SPLIT = 4096.0

#: Keys of the guard's check carriers among a probed pass's carriers (no layer name starts with it).
WATCHED_KEY = "\x00watched/"


def watched_only(carriers):
    """The guard's check carriers (or their cotangents) among ``carriers``, by their tap's key."""
    return {key[len(WATCHED_KEY):]: value for key, value in carriers.items() if key.startswith(WATCHED_KEY)}


def check_row(tensor):
    """``[squares, NaN count high, low, Inf count high, low]`` of ``tensor``, in float32 (see `decode`)."""
    values = jnp.ravel(tensor).astype(jnp.float32)
    squares = jnp.sum(jnp.square(values))

    def counted():
        counts = non_finite_counts([values])[0]
        high, low = counts // int(_SPLIT), counts % int(_SPLIT)
        return jnp.stack([high[0], low[0], high[1], low[1]])

    counts = jax.lax.cond(jnp.isfinite(squares), lambda: jnp.zeros([4], jnp.int32), counted)
    return jnp.concatenate([squares[None], counts.astype(jnp.float32)])


def decode(rows):
    """``(squares [n], counts [n, 2] int32)`` of ``[n, 5]`` check rows."""
    rows = jnp.reshape(rows, (-1, 5))
    nan = rows[:, 1].astype(jnp.int32) * int(_SPLIT) + rows[:, 2].astype(jnp.int32)
    inf = rows[:, 3].astype(jnp.int32) * int(_SPLIT) + rows[:, 4].astype(jnp.int32)
    return rows[:, 0], jnp.stack([nan, inf], axis=1)


@dataclasses.dataclass(frozen=True)
class CheckLayout:
    """A carrier (`kgrad.backends.jax.capture.carriers.tap_gradient`) whose cotangent is a `check_row`."""

    size: int = 5

    def zeros(self):
        return jnp.zeros([self.size], jnp.float32)

    def statistics_of(self, gradient):
        return check_row(gradient)


class WatchedPass:
    """Keras' loss and gradients of one step, with the tensors ``config.watch`` names checked inside.

    Args:
        model: The compiled model (Keras' own ``train_step``).
        config: The guard's `kgrad.plan.options.GuardConfig`.
        checks_gradients: Whether gradients are checked at all (not under a
            loss scaler whose overflows are its own, ``ignore_loss_scale_skips``).

    Attributes:
        before, after: The names of the rows before and after the loss
            (``input/…``, ``activation/…``; ``pred_grad/…``, ``grad/…``), once traced.
    """

    def __init__(self, model, config, checks_gradients):
        self.model, self.config = model, config
        self._operations, self._keep = selection.resolve_selection(model, config.layers)
        self._gradients = checks_gradients
        self.before = self.after = None

    def _watches_gradient(self, kind):
        option = {"activation": "activation_gradients", "prediction": "prediction_gradient"}.get(kind)
        return self._gradients and option is not None and self.config.captures(option)

    def _watches_value(self, kind):
        option = {"activation": "activations", "input": "inputs"}.get(kind)
        return option is not None and self.config.captures(option)

    def loss_and_gradients(self, state, x, y, sample_weight, inverse_scale):
        """``(aux, gradients, (before rows, after rows))``: what Keras' step differentiates, and the checks.

        ``aux`` is ``compute_loss_and_updates``' ``(unscaled loss, ŷ, non-trainable, metrics)``.
        """
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        kinds = self.discover(trainable, non_trainable, x)

        def loss_fn(trainable, carriers):
            forward = {}
            taps = KeyedTaps(self.tap(kinds, carriers, forward, inverse_scale), self._keep)
            with intercept(self.model, self._operations, taps):
                loss, aux = self.model.compute_loss_and_updates(
                    trainable, non_trainable, metrics_variables, x, y, sample_weight,
                    training=True, optimizer_variables=optimizer_variables,
                )
            return loss, (aux, forward)

        grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)
        (_, (aux, forward)), (gradients, carried) = grad_fn(trainable, self.carriers(kinds))
        return aux, gradients, self.rows(kinds, forward, carried, x, aux[1])

    @property
    def selection(self):
        """``(operations by name, keep)``: what this pass taps (`kgrad.plan.selection`)."""
        return self._operations, self._keep

    def carriers(self, kinds):
        """``{key: zeros}``: a check carrier (`CheckLayout`) for each watched gradient among ``kinds``."""
        return {key: CheckLayout().zeros() for key, kind in kinds.items() if self._watches_gradient(kind)}

    def carriers_among_others(self, kinds):
        """`carriers` keyed for a pass whose carriers are also another user's (see `watched_only`)."""
        return {WATCHED_KEY + key: zeros for key, zeros in self.carriers(kinds).items()}

    def tap(self, kinds, carriers, forward, inverse_scale):
        """``fn(key, kind, tensor) -> tensor``: checks a watched value (into ``forward``), carries a gradient.

        Keys not among ``kinds`` (another selection's, in a pass that taps both) pass through.
        """

        def tap(key, kind, tensor):
            if key not in kinds:
                return tensor
            if self._watches_value(kind):
                forward[key] = check_row(tensor)
            if key in carriers:
                return tap_gradient(tensor, carriers[key], CheckLayout(), inverse_scale)
            return tensor

        return tap

    def rows(self, kinds, forward, carried, x, y_pred):
        """``(before rows [n, 5], after rows [m, 5])``, in TensorFlow's order, named in `before`, `after`."""
        names = self._names(kinds, x, y_pred)
        before = [key for key in kinds if key in forward]
        # From the loss down: dJ/dŷ, then dJ/d(activation) of the last layer first.
        after = [key for key in kinds if kinds[key] == "prediction" and key in carried]
        after += [key for key in reversed(list(kinds)) if kinds[key] == "activation" and key in carried]
        self.before = tuple(names[key][0] for key in before)
        self.after = tuple(names[key][1] for key in after)
        return _stack([forward[key] for key in before]), _stack([carried[key] for key in after])

    def part_kinds(self, fn_of, differentiated):
        """``{key: kind}`` of the taps of one pass of a `kgrad.value_and_grad` part, shapes only.

        ``fn_of(*differentiated)`` runs the part's function. Its inputs (another
        part's outputs) are not tapped, as the probe's parts tap none.
        """
        kinds = {}

        def record(key, kind, tensor):
            kinds[key] = kind
            return tensor

        def shapes_only(*differentiated):
            with intercept(self.model, self._operations, KeyedTaps(record, self._keep, tap_inputs=False)):
                fn_of(*differentiated)

        jax.eval_shape(shapes_only, *differentiated)
        return kinds

    def part_value_and_grad(self, fn_of, differentiated, has_aux, inverse_scale=None):
        """``jax.value_and_grad`` of a part (`part_kinds`), with its watched tensors checked in its pass.

        ``inverse_scale``: 1 / the factor ``fn_of`` scaled its loss by (mixed
        precision), or ``None``: the gradients are checked as the true loss's.

        Returns ``(result, [gradient per differentiated argument], watched)``,
        ``watched`` being ``((before names, rows), (after names, rows))`` named
        as in Keras' step (``activation/<layer>``, ``grad/<layer>``).
        """
        kinds = self.part_kinds(fn_of, differentiated)

        def with_checks(carriers, *differentiated):
            forward = {}
            taps = KeyedTaps(self.tap(kinds, carriers, forward, inverse_scale), self._keep, tap_inputs=False)
            with intercept(self.model, self._operations, taps):
                out = fn_of(*differentiated)
            value, aux = out if has_aux else (out, None)
            return value, (aux, forward)

        grad_fn = jax.value_and_grad(with_checks, argnums=tuple(range(len(differentiated) + 1)), has_aux=True)
        (value, (aux, forward)), (carried, *gradients) = grad_fn(self.carriers(kinds), *differentiated)
        predictions = [key for key, kind in kinds.items() if kind == "prediction"]
        before, after = self.rows(kinds, forward, carried, None, predictions)
        result = (value, aux) if has_aux else value
        return result, gradients, ((self.before, before), (self.after, after))

    def discover(self, trainable, non_trainable, x):
        """``{key: kind}`` of the taps of one forward pass, in order (shapes only: `jax.eval_shape`)."""
        kinds = {}

        def record(key, kind, tensor):
            kinds[key] = kind

        trace_taps(self.model, self._operations, self._keep, record, trainable, non_trainable, x)
        return kinds

    def _names(self, kinds, x, y_pred):
        """``{key: (its forward row's name, its gradient row's name)}``, as TensorFlow's guard names them."""
        input_keys = [key for key in kinds if kinds[key] == "input"]
        # A part of an own train_step taps no input (x is None there).
        inputs = io_names(input_keys, "input", float_input_names(self.model, x)) if input_keys else []
        outputs = io_names(y_pred, "output", getattr(self.model, "output_names", None))
        order = {"input": iter(inputs), "prediction": iter(outputs)}
        names = {}
        for key, kind in kinds.items():
            if kind == "activation":
                names[key] = (f"activation/{key}", f"grad/{key}")
            else:
                name = next(order[kind])
                names[key] = (f"input/{name}", None) if kind == "input" else (None, f"pred_grad/{name}")
        return names


def _stack(rows):
    return jnp.stack(rows) if rows else jnp.zeros([0, 5], jnp.float32)
