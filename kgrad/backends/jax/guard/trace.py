"""The replay's pass on JAX: the instrumented pass, with every layer and op output checked.

`replayed_pass` runs a step's loss once more (`trace_step`: Keras'
``compute_loss_and_updates``, jitted when the model's steps are; a part of
a model's own step: its function) as one
`kgrad.backends.jax.capture.instrumented.InstrumentedPass` whose listener,
`ReplayPerturbations`, taps the output of every layer, nested layer and
``keras.ops`` node and the model's float inputs: each gets a zero
perturbation (a carrier the size of the output, as in Flax's ``perturb``),
whose gradient is dJ/d(that output), and the NaN/Inf counts of each call's
inputs and outputs and the finite range of its inputs are computed on the
device. Which operation consumed which output is seen while tracing (the
same traced value). Only small arrays come back to the host
(`kgrad.backends.jax.guard.device_reads`: with several processes, replicated
first, so that every process reads them). It runs on a trip only. `located`
describes those calls as `kgrad.backends.common.locate.Call`s and applies the
NaN-birth rules, the same as TensorFlow's; `before_the_pass` checks what needs
no pass: the weights and the data, counted on the devices too.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from keras import tree

from kgrad.backends.common import locate
from kgrad.backends.common.calls import replaced_calls
from kgrad.backends.common.model_io import is_float, model_relative_path
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.capture.instrumented import InstrumentedPass, Listener
from kgrad.backends.jax.guard.device_reads import counts, finite_range, measured, readable
from kgrad.plan.operations import tappable_operations


@dataclasses.dataclass
class Call:
    """One call of an operation in the replayed pass, in the order the calls returned."""

    key: str  # "log", "dense#2" (called again), "layer" of perturbations "layer/0", "layer/1"
    name: str  # the operation's name in `kgrad.plan.operations.tappable_operations`
    operation: object
    producers: list  # keys of the calls whose outputs it took as inputs
    inputs: list = dataclasses.field(default_factory=list, repr=False)
    outputs: list = dataclasses.field(default_factory=list, repr=False)


class ReplayPerturbations(Listener):
    """The replay's listener: a zero perturbation on every float output it taps, and each call's account.

    Args:
        operations: ``{name: operation}``, every one tapped.

    Attributes:
        calls: The `Call`s of the differentiated pass, once it has been traced.
    """

    def __init__(self, operations):
        self.selection = (operations, None)
        self.calls = []
        self._producer = {}  # id(traced value) -> key of its call; `calls` holds the values alive
        self._tapped = {}  # id(perturbed output) -> its key

    def discovered(self, found, trace):
        # The prediction is the last call's output, already perturbed there.
        return {
            key: jnp.zeros(shape, jnp.float32) for key, (kind, shape) in found.items() if kind != "prediction"
        }

    def tap(self, key, kind, tensor, carriers, forward):
        if key not in carriers:
            return tensor
        tensor = tensor + carriers[key].astype(tensor.dtype)
        self._tapped[id(tensor)] = key
        if kind == "input":
            self._producer[id(tensor)] = "input"
        return tensor

    def recording(self, carriers):
        """Notes each call's inputs and (perturbed) outputs, outside the pass's taps."""
        return replaced_calls([(op, self._noting(name, op)) for name, op in self.selection[0].items()])

    def _noting(self, name, operation):
        def make(tapped_call):
            def call(*args, **kwargs):
                outputs = tapped_call(*args, **kwargs)
                floats = [leaf for leaf in tree.flatten(outputs) if is_float(leaf)]
                keys = [self._tapped.get(id(leaf)) for leaf in floats]
                if keras_internals.in_symbolic_scope() or not floats or None in keys:
                    return outputs
                inputs = [leaf for leaf in tree.flatten((args, kwargs)) if is_float(leaf)]
                producers = [self._producer[id(leaf)] for leaf in inputs if id(leaf) in self._producer]
                key = keys[0] if len(keys) == 1 else keys[0].rpartition("/")[0]
                self.calls.append(Call(key, name, operation, list(dict.fromkeys(producers)), inputs, floats))
                self._producer.update({id(leaf): key for leaf in floats})
                return outputs

            return call

        return make

    def finish(self, forward):
        """Per call: NaN/Inf counts of its outputs and inputs, the finite range of its inputs."""
        calls = self.calls or [Call("", "", None, [])]
        return {
            "outputs": jnp.stack([counts(call.outputs) for call in calls]),
            "inputs": jnp.stack([counts(call.inputs) for call in calls]),
            "ranges": jnp.stack([finite_range(call.inputs) for call in calls]),
        }


def replayed_pass(model, operations, call, values, read, jit=False, given=()):
    """Runs ``call(*values, *given)`` and its backward pass with every call of ``operations`` checked.

    Args:
        model: The model (or the sub-model of a part) whose call's float inputs
            are perturbed too (their gradient is dJ/dx).
        operations: ``{name: operation}`` tapped while the pass runs.
        call: ``fn(*values, *given) -> out``, differentiated with respect to ``values``.
        values: The differentiated values (a list).
        read: ``fn(out, calls) -> (value differentiated, loss, prediction leaves)``.
        jit: Whether the pass runs jitted.
        given: What else ``call`` reads (the rest of the state, the batch):
            arguments of the jitted pass, not constants it closes over (with
            several processes JAX refuses to close over an array that other
            processes hold part of).

    Returns:
        ``(calls, host arrays)``: ``outputs``, ``inputs`` (``[calls, 2]`` NaN/Inf
        counts), ``ranges`` (``[calls, 3]``: min, max of the finite inputs,
        whether any), ``loss``, ``prediction_range``, ``gradients``
        (``{perturbation key: [nan, inf]}`` of dJ/d(output) and dJ/dx) and
        ``weight_gradients`` (``[leaves of values, 2]``).
    """
    perturbations = ReplayPerturbations(operations)

    def run(values, given):
        def loss(*values):
            value, loss, prediction = read(call(*values, *given), perturbations.calls)
            return value, {"loss": counts([loss]), "prediction_range": finite_range(prediction)}

        pass_ = InstrumentedPass(model, [perturbations])
        pass_.discover(loss, values)
        (_, arrays), gradients, (forward,), (perturbed,) = pass_.value_and_grad(loss, values, has_aux=True)
        leaves = jax.tree_util.tree_leaves(gradients)
        return {
            **arrays, **forward, "gradients": {key: counts([g]) for key, g in perturbed.items()},
            "weight_gradients": jnp.stack([counts([g]) for g in leaves] or [counts([])]),
        }

    arrays = (jax.jit(run) if jit else run)(values, tuple(given))
    return perturbations.calls, readable(arrays)


def trace_step(model, operations, x, y, sample_weight, jit=True):
    """`replayed_pass` of Keras' ``compute_loss_and_updates``, from the model's variables."""
    call, trainable, given = _keras_step(model, x, y, sample_weight)

    def read(out, calls):
        loss, aux = out
        return loss, aux[0], tree.flatten(aux[1])  # the unscaled loss, the prediction

    return replayed_pass(model, operations, call, [trainable], read, jit=jit, given=[given])


def checked_function(model, x, y, sample_weight):
    """``(fn(trainable, given) -> loss and gradients, trainable, given)``, for `jax.experimental.checkify`."""
    call, trainable, given = _keras_step(model, x, y, sample_weight)
    return jax.value_and_grad(lambda trainable, given: call(trainable, given)[0]), trainable, given


def _keras_step(model, x, y, sample_weight):
    """``(fn(trainable, given) -> (loss, aux), trainable, given)``: Keras' step's loss, from its state.

    ``given`` is the rest of the state and the batch; ``aux`` is
    ``compute_loss_and_updates``' ``(unscaled loss, ŷ, non-trainable, metrics)``.
    """
    trainable, non_trainable, optimizer_variables, metrics_variables = keras_internals.jax_state(model)

    def loss(trainable, given):
        non_trainable, optimizer_variables, metrics_variables, x, y, sample_weight = given
        return model.compute_loss_and_updates(
            trainable, non_trainable, metrics_variables, x, y, sample_weight,
            training=True, optimizer_variables=optimizer_variables,
        )

    return loss, trainable, (non_trainable, optimizer_variables, metrics_variables, x, y, sample_weight)


#: How the replay names an operation it does not record (`locate.in_forward`).
_UNSEEN = (
    "that is not a layer or a keras.ops node of the model (a jax.numpy call inside a layer's call "
    "is named by the checkify line below, when it ran)"
)
_LOSS_NOTE = (
    "Every layer's output was finite: the loss made it (on JAX the replay does not split the loss into "
    "its terms: compiled loss, add_loss, regularizers)."
)


def before_the_pass(model, inputs, targets, sample_weight):
    """The birth in ``model``'s weights (an earlier update) or in the data, or ``None``.

    Counted on the devices (`device_reads.measured`): no weight or batch is read to the host.
    """
    data = (inputs, targets, sample_weight)
    leaves = [weight.value for weight in model.weights] + tree.flatten(data)
    measures = iter(measured(leaves))
    weights = [(model_relative_path(model, weight), next(measures)) for weight in model.weights]

    def measure_of(leaf):
        found = next(measures)  # (in flatten's order, None leaves included)
        return None if leaf is None else found

    return locate.in_weights(weights) or locate.in_data(*tree.map_structure(measure_of, data))


def located(model, calls, arrays, weight_paths):
    """The birth in the forward or backward pass of a replay (`trace.replayed_pass`), or ``None``."""
    paths = {}
    for path, operation in tappable_operations(model).items():
        if len(path) >= len(paths.get(id(operation), "")):  # its longest path in nested models
            paths[id(operation)] = path
    gradients = arrays["gradients"]
    described = [
        locate.Call(
            call.key, type(call.operation).__name__, paths.get(id(call.operation), call.name),
            output=arrays["outputs"][index], inputs=arrays["inputs"][index],
            input_range=_range(arrays["ranges"][index]), output_gradient=_output_gradient(call, gradients),
            takes=tuple(call.producers),
        )
        for index, call in enumerate(calls)
    ]
    prediction_range = _range(arrays["prediction_range"])
    inputs = [value for key, value in gradients.items() if key.startswith("input:")]
    return locate.in_forward(
        described, locate.Loss(arrays["loss"], note=_LOSS_NOTE), prediction_range, _UNSEEN
    ) or locate.in_backward(
        described, prediction_range, np.sum(inputs or [np.zeros(2, np.int64)], axis=0),
        list(zip(weight_paths, arrays["weight_gradients"])),
    )


def _range(values):
    """``(min, max)`` from the device's ``[min, max, any]``, or ``None``."""
    return (float(values[0]), float(values[1])) if values[2] else None


def _output_gradient(call, gradients):
    keys = [call.key] if call.key in gradients else [k for k in gradients if k.startswith(f"{call.key}/")]
    return np.sum([gradients[key] for key in keys], axis=0) if keys else np.zeros(2, np.int64)
