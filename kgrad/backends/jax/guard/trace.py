"""The replay's pass on JAX: one forward and backward pass with every layer and op output checked.

`replayed_pass` runs a step's loss once more (`trace_step`: Keras'
``compute_loss_and_updates``, jitted when the model's steps are; a part of
a model's own step: its function) with the ``call`` of every layer, nested
layer and ``keras.ops`` node replaced (`kgrad.backends.common.calls`): each float
output gets a zero perturbation, whose gradient is dJ/d(that output) (as in
Flax's ``perturb``), and the NaN/Inf counts of its inputs and outputs and
the finite range of its inputs are computed on the device. Which operation
consumed which output is seen while tracing (the same traced value). Only
small arrays come back to the host. It runs on a trip only.
"""

import dataclasses

import jax
import jax.numpy as jnp
from keras import tree

from kgrad.backends.common.calls import replaced_calls
from kgrad.backends.common.model_io import is_float
from kgrad.backends.jax import keras_internals


@dataclasses.dataclass
class Call:
    """One call of an operation in the replayed pass, in the order the calls returned."""

    key: str  # "log", "dense#2" (called again), "layer/0" (its first float output)
    name: str  # the operation's name in `kgrad.plan.operations.tappable_operations`
    operation: object
    producers: list  # keys of the calls whose outputs it took as inputs
    inputs: list = dataclasses.field(default_factory=list, repr=False)
    outputs: list = dataclasses.field(default_factory=list, repr=False)


class _Recorder:
    """Replaces the calls while one pass is traced; ``perturbations`` (``None``: record shapes only)."""

    def __init__(self, operations, perturbations=None):
        self.operations = operations
        self.perturbations = perturbations
        self.calls = []
        self.inputs = []  # the model's float inputs (perturbed: their gradient is dJ/dx)
        self._counts = {}
        self._producer = {}  # id(traced value) -> key; `calls` holds the values alive
        self._model_called = False

    def _perturb(self, key, leaf):
        if self.perturbations is None:
            return leaf
        return leaf + self.perturbations[key].astype(leaf.dtype)

    def shapes(self):
        """``{key: ShapeDtypeStruct}`` of the perturbations a pass needs."""
        found = {f"input:{i}": leaf for i, leaf in enumerate(self.inputs)}
        for call in self.calls:
            found.update({call.key if len(call.outputs) == 1 else f"{call.key}/{i}": leaf
                          for i, leaf in enumerate(call.outputs)})
        return {key: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for key, leaf in found.items()}

    def wrap_operation(self, name, operation):
        def make(original_call):
            def call(*args, **kwargs):
                outputs = original_call(*args, **kwargs)
                if keras_internals.in_symbolic_scope():
                    return outputs
                return self._record(name, operation, [leaf for leaf in tree.flatten((args, kwargs))
                                                      if is_float(leaf)], outputs)

            return call

        return make

    def _record(self, name, operation, inputs, outputs):
        count = self._counts[name] = self._counts.get(name, 0) + 1
        key = name if count == 1 else f"{name}#{count}"
        leaves = tree.flatten(outputs)
        floats = [index for index, leaf in enumerate(leaves) if is_float(leaf)]
        producers = [self._producer[id(leaf)] for leaf in inputs if id(leaf) in self._producer]
        call = Call(key, name, operation, list(dict.fromkeys(producers)), inputs)
        for position, index in enumerate(floats):
            leaves[index] = self._perturb(key if len(floats) == 1 else f"{key}/{position}", leaves[index])
            self._producer[id(leaves[index])] = key
            call.outputs.append(leaves[index])
        if floats:
            self.calls.append(call)
        return tree.pack_sequence_as(outputs, leaves)

    def wrap_model(self, original_call):
        def call(*args, **kwargs):
            if args and not self._model_called and not keras_internals.in_symbolic_scope():
                self._model_called = True  # the step's call; a metric's later call is not replayed
                leaves = tree.flatten(args[0])
                for index, leaf in enumerate(leaves):
                    if is_float(leaf):
                        leaves[index] = self._perturb(f"input:{len(self.inputs)}", leaf)
                        self._producer[id(leaves[index])] = "input"
                        self.inputs.append(leaves[index])
                args = (tree.pack_sequence_as(args[0], leaves),) + args[1:]
            return original_call(*args, **kwargs)

        return call

    def replacements(self, model):
        return [(model, self.wrap_model)] + [
            (operation, self.wrap_operation(name, operation)) for name, operation in self.operations.items()
        ]


def _counts(leaves):
    """``[nan, inf]`` over ``leaves`` (int32)."""
    if not leaves:
        return jnp.zeros((2,), jnp.int32)
    return jnp.stack([sum(jnp.sum(jnp.isnan(leaf)) for leaf in leaves),
                      sum(jnp.sum(jnp.isinf(leaf)) for leaf in leaves)]).astype(jnp.int32)


def _finite_range(leaves):
    """``[min, max, has any]`` of the finite values of ``leaves`` (float32)."""
    if not leaves:
        return jnp.zeros((3,), jnp.float32)
    flat = jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in leaves])
    finite = jnp.isfinite(flat)
    return jnp.stack([jnp.min(jnp.where(finite, flat, jnp.inf)), jnp.max(jnp.where(finite, flat, -jnp.inf)),
                      jnp.any(finite).astype(jnp.float32)])


def replayed_pass(model, operations, call, values, read, jit=False):
    """Runs ``call(*values)`` and its backward pass with every call of ``operations`` checked.

    Args:
        model: The model (or the sub-model of a part) whose call's float inputs
            are perturbed too (their gradient is dJ/dx).
        operations: ``{name: operation}`` replaced while the pass runs.
        call: ``fn(*values) -> out``, differentiated with respect to ``values``.
        values: The differentiated values (a list).
        read: ``fn(out, calls) -> (value differentiated, loss, prediction leaves)``.
        jit: Whether the pass runs jitted.

    Returns:
        ``(calls, host arrays)``: ``outputs``, ``inputs`` (``[calls, 2]`` NaN/Inf
        counts), ``ranges`` (``[calls, 3]``: min, max of the finite inputs,
        whether any), ``loss``, ``prediction_range``, ``gradients``
        (``{perturbation key: [nan, inf]}`` of dJ/d(output) and dJ/dx) and
        ``weight_gradients`` (``[leaves of values, 2]``).
    """
    traced = {}

    def loss(values, perturbations):
        recorder = traced["recorder"] = _Recorder(operations, perturbations)
        with replaced_calls(recorder.replacements(model)):
            out = call(*values)
        calls = recorder.calls
        value, loss, prediction = read(out, calls)
        return value, {
            "outputs": jnp.stack([_counts(call.outputs) for call in calls] or [_counts([])]),
            "inputs": jnp.stack([_counts(call.inputs) for call in calls] or [_counts([])]),
            "ranges": jnp.stack([_finite_range(call.inputs) for call in calls] or [_finite_range([])]),
            "loss": _counts([loss]),
            "prediction_range": _finite_range(prediction),
        }

    jax.eval_shape(lambda values: loss(values, None), values)
    perturbations = {key: jnp.zeros(s.shape, s.dtype) for key, s in traced["recorder"].shapes().items()}

    def run(values, perturbations):
        grad_fn = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
        (_, forward), (gradients, perturbed) = grad_fn(values, perturbations)
        forward["gradients"] = {key: _counts([g]) for key, g in perturbed.items()}
        leaves = jax.tree_util.tree_leaves(gradients)
        forward["weight_gradients"] = jnp.stack([_counts([g]) for g in leaves] or [_counts([])])
        return forward

    arrays = (jax.jit(run) if jit else run)(values, perturbations)
    return traced["recorder"].calls, jax.device_get(arrays)


def trace_step(model, operations, x, y, sample_weight, jit=True):
    """`replayed_pass` of Keras' ``compute_loss_and_updates``, from the model's variables."""
    state = (
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.metrics_variables],
        [v.value for v in model.optimizer.variables],
    )

    def call(trainable):
        return model.compute_loss_and_updates(
            trainable, *state[:2], x, y, sample_weight, training=True, optimizer_variables=state[2]
        )

    def read(out, calls):
        loss, aux = out
        return loss, aux[0], tree.flatten(aux[1])  # the unscaled loss, the prediction

    trainable = [v.value for v in model.trainable_variables]
    return replayed_pass(model, operations, call, [trainable], read, jit=jit)


def checked_function(model, x, y, sample_weight):
    """The replayed pass as ``fn() -> loss and gradients``, for `jax.experimental.checkify`."""
    state = (
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.metrics_variables],
        [v.value for v in model.optimizer.variables],
    )
    trainable = [v.value for v in model.trainable_variables]

    def step(trainable):
        def loss(trainable):
            value, _ = model.compute_loss_and_updates(trainable, *state[:2], x, y, sample_weight,
                                                      training=True, optimizer_variables=state[2])
            return value

        return jax.value_and_grad(loss)(trainable)

    return step, trainable
