"""``instruments=["per_example"]`` on JAX: which layers get per-example norms, their carriers, their tags.

The tags and their meaning are TensorFlow's
(`kgrad.backends.tensorflow.summarize.instruments`): ``example_grad_norm_<stat>/<weight
path>`` (and ``example_grad_norm_hist/``), ``noise_example_sq_norm_mean/<layer>``,
``noise_batch_sq_norm/<layer>``, their ``global/`` sums when every trainable
weight is covered, and ``global/batch_size``. The numbers come from the
layers' per-example carriers (`kgrad.backends.jax.summarize.example_norms`):
`PerExampleLayers.wrap` puts one on the output of each captured layer with
weights, *outside* kgrad's own tap (so the carrier sees the dJ/d(output) that
the layer's tap sees), with the layer's input and weights as residuals.
A layer called more than once in a step (a shared layer) gets one carrier per
call instead, each taking that call's per-example weight gradients whole
(``[B, weights]`` floats, refused above `SHARED_FLOATS`): an example's gradient
is the sum of its calls', so the norms are taken after the backward pass, of
the sum. An unsupported layer, and every layer of a model with a trainable
BatchNormalization, get no tags and one warning.
"""

import contextlib

import jax
import jax.numpy as jnp
import keras
import numpy as np

from kgrad.backends.common.calls import replaced_calls
from kgrad.backends.common.model_io import model_relative_path
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.summarize import example_norms, stats
from kgrad.plan import operations

#: Keys of the per-example carriers among the step's carriers (no layer name starts with it).
PREFIX = "\x00per_example/"
#: The most floats a shared layer's per-call carriers may hold in all (256 MB of float32).
SHARED_FLOATS = 2**26


def _call_key(name, call):
    return f"{PREFIX}{name}\x00{call}"


def _coupling_layers(model):
    return [
        layer.name
        for layer in keras_internals.flatten_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable
    ]


class PerExampleLayers:
    """The per-example carriers of a probed step.

    Args:
        model: The probed model.
        operations_by_name: The captured operations (`kgrad.plan.selection.resolve_selection`).
        keep: Its predicate, or ``None``.
    """

    def __init__(self, model, operations_by_name, keep):
        self.model = model
        self._candidates = {
            name: op
            for name, op in operations_by_name.items()
            # A layer made of layers: its weights are its leaves', reported when those are captured.
            if isinstance(op, keras.layers.Layer) and not operations.children(op)
        }
        self._keep = keep
        self.reasons = {}
        self._layers = {}  # name -> layer, of those with a carrier
        self._calls = {}  # name -> calls in a step, of the shared layers among them
        self._rows = None

    def carriers_of(self, trace):
        """``{key: zeros}``: one carrier per layer with per-example norms, of those ``trace()`` calls.

        ``trace``: e.g. ``lambda: jax.eval_shape(...)`` of Keras' forward pass,
        or of the function a `kgrad.value_and_grad` call differentiates.
        """
        calls = {}

        def count(name, op):
            def wrap(call):
                def counted(*args, **kwargs):
                    output = call(*args, **kwargs)
                    if not keras_internals.in_symbolic_scope() and op.trainable_weights and self._kept(op):
                        calls.setdefault(name, []).append(output)
                    return output

                return counted

            return wrap

        with replaced_calls([(op, count(name, op)) for name, op in self._candidates.items()]):
            trace()
        coupled = _coupling_layers(self.model)
        carriers = {}
        for name, outputs in calls.items():
            layer = self._candidates[name]
            reason = example_norms.unsupported_reason(layer)
            if coupled:
                reason = (
                    f"not defined: {_names(coupled)} (BatchNormalization in training mode) "
                    "couples the examples of the batch"
                )
            elif reason is None and any(len(jax.tree.leaves(output)) != 1 for output in outputs):
                reason = "more than one output"
            rows = {jax.tree.leaves(output)[0].shape[0] for output in outputs}
            if reason is None and len(outputs) > 1:
                reason = _shared_reason(layer, len(outputs), rows)
            if reason is not None:
                self.reasons[name] = reason
                continue
            self._layers[name] = layer
            self._rows = rows.pop()
            if len(outputs) > 1:
                self._calls[name] = len(outputs)
                size = sum(int(np.prod(weight.shape)) for weight in layer.trainable_weights)
                for call in range(len(outputs)):
                    carriers[_call_key(name, call)] = jnp.zeros([self._rows, size], jnp.float32)
            else:
                weights = len(layer.trainable_weights)
                carriers[PREFIX + name] = jnp.zeros([weights, self._rows + 1], jnp.float32)
        return carriers

    def _kept(self, op):
        return self._keep is None or self._keep(op)

    @contextlib.contextmanager
    def wrap(self, carriers, inverse_scale=None):
        """Puts each layer's carrier on its output while the block runs (enter it after the taps)."""

        def make(name, layer):
            calls = self._calls.get(name)
            if calls is None:
                reduce, keys = example_norms.reducer(layer, inverse_scale), [PREFIX + name]
            else:
                reduce = example_norms.gradients_reducer(layer, inverse_scale)
                keys = [_call_key(name, call) for call in range(calls)]
            seen = iter(keys)

            def wrap(call):
                def carried(*args, **kwargs):
                    output = call(*args, **kwargs)
                    if keras_internals.in_symbolic_scope():
                        return output
                    key = next(seen, None)
                    if key is None:
                        raise RuntimeError(
                            f"kgrad: layer {name!r} was called more often in the probed step than the "
                            f"{len(keys)} time(s) found when the step was traced for shapes; its "
                            "per-example norms would miss a call. Call it the same number of times in "
                            "every trace of the step, or leave 'per_example' out of `instruments`."
                        )
                    weights = (
                        [w.value for w in layer.trainable_weights],
                        [w.value for w in layer.non_trainable_weights],
                    )
                    inputs = jax.lax.stop_gradient((args[0], weights))
                    return example_norms.example_tap(output, carriers[key], inputs[0], inputs[1], reduce)

                return carried

            return wrap

        replacements = [(layer, make(name, layer)) for name, layer in self._layers.items()]
        with replaced_calls(replacements):
            yield

    def add_rows(self, rows, carried, bucket_count):
        """Adds the per-example tags from the carriers; returns ``{layer: why not}`` of the others."""
        covered, model_example, model_batch = set(), [], []
        for name, layer in self._layers.items():
            if name in self._calls:
                shares = [carried[_call_key(name, call)] for call in range(self._calls[name])]
                sq_norms, batch = _sums_of_calls(layer, shares)
            else:
                values = carried[PREFIX + name]
                sq_norms, batch = values[:, :-1], values[:, -1]
            for weight, weight_sq_norms in zip(layer.trainable_weights, sq_norms):
                path = model_relative_path(self.model, weight)
                norms = jnp.sqrt(jnp.maximum(weight_sq_norms, 0.0))
                shape = norms.shape
                wants = rows.wants_histogram("example_grad_norm", shape)
                columns = rows.columns("example_grad_norm", shape)
                row, histogram = stats.summarize(norms, bucket_count if wants else None, columns)
                rows.add("example_grad_norm", path, row, histogram, shape)
                covered.add(id(weight))
            # mean_i ‖B·∇ℓ_i‖² = B·Σ_i ‖∇ℓ_i‖²: example i's gradient on its own, in ∇J's scale.
            example_sum = jnp.sum(sq_norms)
            rows.add_scalar(f"noise_example_sq_norm_mean/{name}", self._rows * example_sum)
            rows.add_scalar(f"noise_batch_sq_norm/{name}", jnp.sum(batch))
            model_example.append(example_sum)
            model_batch.append(jnp.sum(batch))
        if self._layers:
            if all(id(weight) in covered for weight in self.model.trainable_variables):
                rows.add_scalar("global/noise_example_sq_norm_mean", self._rows * sum(model_example))
                rows.add_scalar("global/noise_batch_sq_norm", sum(model_batch))
            rows.add_scalar("global/batch_size", float(self._rows))
        return dict(self.reasons)


def _shared_reason(layer, calls, rows):
    """Why a layer called ``calls`` times (outputs of ``rows`` examples) gets no norms, or ``None``."""
    if len(rows) != 1:
        return f"called {calls} times in the step on batches of different sizes ({sorted(rows)})"
    size = rows.copy().pop() * sum(int(np.prod(weight.shape)) for weight in layer.trainable_weights)
    if calls * size > SHARED_FLOATS:
        return (
            f"called {calls} times in the step: its per-example norms need each call's per-example "
            f"gradients ({calls} x {size} floats), more than kgrad holds ({SHARED_FLOATS})"
        )
    return None


def _sums_of_calls(layer, shares):
    """``([weights, B] squared norms, [weights] ‖Σ_i ∇ℓ_i‖²)``, from each call's ``[B, W]`` gradients."""
    gradients = sum(shares)  # an example's gradient: the sum of its calls'
    sq_norms, batch, start = [], [], 0
    for weight in layer.trainable_weights:
        size = int(np.prod(weight.shape))
        part = gradients[:, start : start + size]
        sq_norms.append(jnp.sum(jnp.square(part), axis=1))
        batch.append(jnp.sum(jnp.square(jnp.sum(part, axis=0))))
        start += size
    return jnp.stack(sq_norms), jnp.stack(batch)


def _names(names, shown=3):
    quoted = ", ".join(repr(name) for name in names[:shown])
    return quoted if len(names) <= shown else f"{quoted} and {len(names) - shown} more"
