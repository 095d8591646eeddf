"""The guard's ``watch=`` beyond the default on JAX: inputs, activations and their gradients, every step.

`WatchTaps` is the guard's listener of the instrumented pass
(`kgrad.backends.jax.capture.instrumented`), alone (`WatchedPass`: Keras'
step, or a part of a model's own step) or beside the probe's: each watched
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

from kgrad.backends.jax.capture.carriers import tap_gradient
from kgrad.backends.jax.capture.instrumented import InstrumentedPass, Listener
from kgrad.backends.jax.guard.sentinel import non_finite_counts
from kgrad.backends.jax.summarize.on_device import reducible
from kgrad.plan import selection
from kgrad.plan.tag_names import io_names

# A count is carried as float32 (a cotangent) in two parts, each below 2**24: exact to int32's 2**31.
_SPLIT = 4096.0


def check_row(tensor):
    """``[squares, NaN count high, low, Inf count high, low]`` of ``tensor``, in float32 (see `decode`)."""
    values = reducible(jnp.asarray(tensor).astype(jnp.float32))  # (a sharded tensor is not flattened)
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
    """The tensors ``config.watch`` names in one model's pass, checked inside it.

    Args:
        model: The compiled model (Keras' own ``train_step``), or the sub-model
            of a `kgrad.value_and_grad` part.
        config: The guard's `kgrad.plan.options.GuardConfig`.
        checks_gradients: Whether gradients are checked at all (not under a
            loss scaler whose overflows are its own, ``ignore_loss_scale_skips``).

    Attributes:
        before, after: The names of the rows before and after the loss
            (``input/…``, ``activation/…``; ``pred_grad/…``, ``grad/…``), once traced.
    """

    def __init__(self, model, config, checks_gradients):
        self.model, self.config = model, config
        self.selection = selection.resolve_selection(model, config.layers)
        self.checks_gradients = checks_gradients
        self.before = self.after = None

    def listener(self, inverse_scale=None):
        """A `WatchTaps` of one pass; ``inverse_scale``: 1 / its loss scale (checks of the true loss)."""
        return WatchTaps(self, inverse_scale)

    def part_value_and_grad(self, call, values, has_aux, role, inverse_scale=None):
        """``jax.value_and_grad`` of a part, ``call(*values)``, with its watched tensors checked in its pass.

        ``role``: the part's `kgrad.backends.jax.own_step.resolve.PartRole`.
        ``inverse_scale``: 1 / the factor ``call`` scaled its loss by (mixed
        precision), or ``None``: the gradients are checked as the true loss's.

        Returns ``(result, [gradient per value], watched)``, ``watched`` being
        ``((before names, rows), (after names, rows))`` named as in Keras' step
        (``activation/<layer>``, ``grad/<layer>``).
        """
        watch = self.listener(inverse_scale)
        pass_ = InstrumentedPass(self.model, [watch], tap_inputs=role.tap_inputs)
        pass_.discover(call, values)
        result, gradients, (forward,), (carried,) = pass_.value_and_grad(call, values, has_aux)
        return result, gradients, watch.part_rows(forward, carried, role, result)


class WatchTaps(Listener):
    """The guard's listener of one instrumented pass (`kgrad.backends.jax.capture.instrumented`).

    Each watched forward tensor gives its `check_row` where it is made; each
    watched gradient its row through a carrier (`CheckLayout`).
    """

    def __init__(self, watch, inverse_scale=None):
        self.watch, self.selection, self.inverse_scale = watch, watch.selection, inverse_scale
        self.kinds = {}  # key -> kind of its taps, once discovered

    def _watches_gradient(self, kind):
        option = {"activation": "activation_gradients", "prediction": "prediction_gradient"}.get(kind)
        return self.watch.checks_gradients and option is not None and self.watch.config.captures(option)

    def _watches_value(self, kind):
        option = {"activation": "activations", "input": "inputs"}.get(kind)
        return option is not None and self.watch.config.captures(option)

    def discovered(self, found, trace):
        self.kinds = {key: kind for key, (kind, _) in found.items()}
        watched = [key for key, kind in self.kinds.items() if self._watches_gradient(kind)]
        return {key: CheckLayout().zeros() for key in watched}

    def tap(self, key, kind, tensor, carriers, forward):
        if self._watches_value(kind):
            forward[key] = check_row(tensor)
        if key in carriers:
            return tap_gradient(tensor, carriers[key], CheckLayout(), self.inverse_scale)
        return tensor

    def rows(self, forward, carried, input_names, outputs):
        """``(before rows [n, 5], after rows [m, 5])``, in TensorFlow's order, named in the watch's
        ``before``, ``after``.

        ``input_names``: ``fn(input keys) -> their names``; ``outputs``: what the output names come from.
        """
        kinds = self.kinds
        names = self._names(input_names, outputs)
        before = [key for key in kinds if key in forward]
        # From the loss down: dJ/dŷ, then dJ/d(activation) of the last layer first.
        after = [key for key in kinds if kinds[key] == "prediction" and key in carried]
        after += [key for key in reversed(list(kinds)) if kinds[key] == "activation" and key in carried]
        self.watch.before = tuple(names[key][0] for key in before)
        self.watch.after = tuple(names[key][1] for key in after)
        return _stack([forward[key] for key in before]), _stack([carried[key] for key in after])

    def part_rows(self, forward, carried, role, result):
        """``((before names, rows), (after names, rows))`` of a part's pass, named as its ``role`` says."""
        predictions = [key for key, kind in self.kinds.items() if kind == "prediction"]
        before, after = self.rows(forward, carried, role.input_names, role.outputs(result, predictions))
        return (self.watch.before, before), (self.watch.after, after)

    def _names(self, input_names, outputs):
        """``{key: (its forward row's name, its gradient row's name)}``, as TensorFlow's guard names them."""
        kinds, model = self.kinds, self.watch.model
        input_keys = [key for key in kinds if kinds[key] == "input"]
        # A part of an own train_step taps no input.
        inputs = input_names(input_keys) if input_keys else []
        outputs = io_names(outputs, "output", getattr(model, "output_names", None))
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
