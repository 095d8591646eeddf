"""The instrumented pass: one ``jax.value_and_grad`` whose taps every listener reads.

Every traced JAX step kgrad runs differentiates once, through this module:
Keras' own ``train_step`` (a probed step, a guarded one, both), and each
`kgrad.value_and_grad` call of a model's own ``train_step``. The pass

1. discovers the taps (`InstrumentedPass.discover`: a shape-only trace,
   ``jax.eval_shape``, with the layers every listener selects intercepted,
   `kgrad.backends.jax.capture.taps`), and hands each listener its own;
2. collects each listener's carriers (small zeros whose cotangent is the
   statistics of a dJ/d(output), `kgrad.backends.jax.capture.carriers`):
   they are arguments of the differentiated function, so they must exist
   before it is traced;
3. runs one ``jax.value_and_grad`` over the differentiated values and the
   carriers, each tapped output going through every listener that selected it;
4. gives back, per listener, what it computed in the forward pass and its
   carriers' cotangents, for it to read.

The listeners: the probe's statistics (`kgrad.backends.jax.capture.probe_taps`),
the instruments (`kgrad.backends.jax.summarize.instruments`) and the guard's
checks (`kgrad.backends.jax.guard.watched`).

Example:

>>> import jax.numpy as jnp, keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
>>> class Names(Listener):
...     selection = ({"d": model.layers[0]}, None)
...     def discovered(self, found, trace):
...         self.found = found
...         return {}
>>> names = Names()
>>> call = lambda w: jnp.sum(model.stateless_call(w, [], jnp.ones((3, 2)))[0])
>>> pass_ = InstrumentedPass(model, [names])
>>> pass_.discover(call, [[v.value for v in model.trainable_variables]])
>>> names.found
{'input:0': ('input', (3, 2)), 'd': ('activation', (3, 1)), 'prediction:0': ('prediction', (3, 1))}
"""

import contextlib

import jax

from kgrad.backends.jax.capture.taps import KeyedTaps, intercept, union_selection


class Listener:
    """What a listener of the pass may do; each method's default does nothing.

    Attributes:
        selection: ``(operations by name, keep)`` of the layers whose outputs it
            taps (`kgrad.plan.selection.resolve_selection`). The model's inputs
            and predictions, and `kgrad.tap` calls, reach every listener.
    """

    selection = ({}, None)

    def discovered(self, found, trace):
        """``{key: zeros}``: its carriers, given ``found`` ``{key: (kind, shape)}`` of its taps, in order.

        ``trace()`` traces the differentiated function once more, for shapes only
        (what a listener intercepting other calls needs).
        """
        del found, trace
        return {}

    def recording(self, carriers):
        """A context entered around the differentiated function, inside the taps."""
        del carriers
        return contextlib.nullcontext()

    def tap(self, key, kind, tensor, carriers, forward):
        """The tensor to use in place of a tapped one; may put what it computes into ``forward``."""
        del key, kind, carriers, forward
        return tensor

    def finish(self, forward):
        """``forward`` as it leaves the differentiated function (e.g. its statistics, batched)."""
        return forward


class InstrumentedPass:
    """One differentiated pass of ``model``'s layers with ``listeners`` tapping them.

    Args:
        model: The model (or sub-model) whose layers are tapped.
        listeners: `Listener`s, in the order each tapped output goes through them.
        tap_inputs: Whether the model's float inputs are tapped (not in a part of
            a model's own ``train_step``: there they are another part's outputs).
    """

    def __init__(self, model, listeners, tap_inputs=True):
        self.model, self.listeners = model, list(listeners)
        self._tap_inputs = tap_inputs
        self._operations, self._keep = union_selection(*(listener.selection for listener in self.listeners))
        self._routes = None  # key -> the listeners that tap it, once discovered
        self._carriers = None

    def discover(self, call, values):
        """Finds the taps of ``call(*values)`` (shapes only) and each listener's carriers."""
        found, routes = [{} for _ in self.listeners], {}
        selected = [({id(op) for op in chosen.values()}, keep) for chosen, keep in self._selections()]
        taps = None

        def record(key, kind, tensor):
            operation = taps.operation
            for number, (ids, keep) in enumerate(selected):
                if operation is None or (id(operation) in ids and (keep is None or keep(operation))):
                    found[number][key] = (kind, tuple(tensor.shape))
                    routes.setdefault(key, []).append(number)
            return tensor

        def shapes_only(*values):
            nonlocal taps
            taps = _OperationNoting(record, self._keep, self._tap_inputs)
            with intercept(self.model, self._operations, taps):
                return call(*values)

        jax.eval_shape(shapes_only, *values)
        self._routes = routes
        trace = lambda: jax.eval_shape(call, *values)  # noqa: E731
        self._carriers = [listener.discovered(mine, trace) for listener, mine in zip(self.listeners, found)]

    def value_and_grad(self, call, values, has_aux):
        """``(result, [gradient per value], [forward per listener], [cotangents per listener])``.

        ``result`` is ``call(*values)``'s value, or ``(value, aux)`` with ``has_aux``;
        `discover` must have run on the same call.
        """
        listeners, routes = self.listeners, self._routes

        def differentiated(carriers, *values):
            forwards = [{} for _ in listeners]

            def tap(key, kind, tensor):
                for number in routes.get(key, ()):
                    tensor = listeners[number].tap(key, kind, tensor, carriers[number], forwards[number])
                return tensor

            with intercept(self.model, self._operations, KeyedTaps(tap, self._keep, self._tap_inputs)), \
                    contextlib.ExitStack() as stack:
                for listener, mine in zip(listeners, carriers):
                    stack.enter_context(listener.recording(mine))
                out = call(*values)
            value, aux = out if has_aux else (out, None)
            return value, (aux, [listener.finish(forward) for listener, forward in zip(listeners, forwards)])

        grad_fn = jax.value_and_grad(differentiated, argnums=tuple(range(len(values) + 1)), has_aux=True)
        (value, (aux, forwards)), (cotangents, *gradients) = grad_fn(self._carriers, *values)
        return ((value, aux) if has_aux else value), gradients, forwards, cotangents

    def _selections(self):
        return [listener.selection for listener in self.listeners]


class _OperationNoting(KeyedTaps):
    """`KeyedTaps` knowing which operation made the output tapped (``None``: an input, a `kgrad.tap`)."""

    operation = None

    def layer_output(self, name, operation, outputs):
        self.operation = operation
        try:
            return super().layer_output(name, operation, outputs)
        finally:
            self.operation = None
