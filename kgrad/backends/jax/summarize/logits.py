"""``instruments=["logits"]`` on JAX: the logits behind each output's softmax, and their statistics.

The tags and their meaning are TensorFlow's (`kgrad.backends.tensorflow.summarize.logits`):
``logit_max_<mean|max>/<output>``, ``logit_lse_…``, ``logit_entropy_…``,
``logit_top1_prob_…``, over the last axis, at every example and position.

JAX has no ``_keras_logits`` on a softmax's output: `LogitCapture` records
them while the probed step runs. The softmax (or sigmoid) of a layer's own
``activation`` (``Dense(..., activation="softmax")``, ``Activation``) is
replaced on the instance by one that keeps its input; a ``Softmax`` layer and
a ``keras.ops.softmax``/``sigmoid`` node of a functional model keep their call's
input. A model output that is one of those outputs has those logits (a
sigmoid output gets no tags, with TensorFlow's reason); any other output is
taken as logits itself (a language model's head).
"""

import contextlib

import jax.numpy as jnp
import keras
from jax.scipy.special import logsumexp

from kgrad.backends.common.calls import replaced_calls
from kgrad.backends.common.norms import nan_max
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.summarize.compiled import compiled_on_its_own

_KINDS = {keras.activations.softmax: "softmax", keras.activations.sigmoid: "sigmoid"}
SIGMOID = "a sigmoid output: independent probabilities, not a distribution over its last axis"


class LogitCapture:
    """Records the input of every softmax/sigmoid that ends a layer or op, by the id of the call's output.

    Args:
        model: The probed model.
    """

    def __init__(self, model):
        self.model = model
        self.found = {}  # id(output) -> (kind, logits, output)

    def _candidates(self):
        layers = keras_internals.flatten_layers(self.model)
        ops = [op for op in getattr(self.model, "operations", []) if not isinstance(op, keras.layers.Layer)]
        with_activation = [layer for layer in layers if getattr(layer, "activation", None) in _KINDS]
        softmax_layers = [layer for layer in layers if type(layer) is keras.layers.Softmax]
        kind_ops = [op for op in ops if type(op) in (keras_internals.Softmax, keras_internals.Sigmoid)]
        return with_activation, softmax_layers + kind_ops

    @contextlib.contextmanager
    def recording(self):
        """Records while the block runs (enter it after kgrad's taps: it sees the tapped outputs)."""
        pending = []
        with_activation, called = self._candidates()

        def activation_of(layer):
            original, kind = layer.activation, _KINDS[layer.activation]

            def recorded(z, *args, **kwargs):
                pending.append((kind, z))
                return original(z, *args, **kwargs)

            return original, recorded

        def call_of(op):
            def wrap(call):
                def recorded(*args, **kwargs):
                    pending.clear()
                    if op in called:
                        kind = "sigmoid" if type(op) is keras_internals.Sigmoid else "softmax"
                        masked = kwargs.get("mask") is not None or len(args) > 1
                        if not masked and getattr(op, "axis", -1) == -1:
                            pending.append((kind, args[0]))
                    output = call(*args, **kwargs)
                    if pending:
                        self.found[id(output)] = (pending[-1][0], pending[-1][1], output)
                    pending.clear()
                    return output

                return recorded

            return wrap

        swapped = []
        try:
            for layer in with_activation:
                original, recorded = activation_of(layer)
                object.__setattr__(layer, "activation", recorded)
                swapped.append((layer, original))
            with replaced_calls([(op, call_of(op)) for op in with_activation + called]):
                yield self
        finally:
            for layer, original in swapped:
                object.__setattr__(layer, "activation", original)
            self.found.clear()

    def logits(self, output):
        """``(logits, None)`` of one model output, or ``(None, why not)``."""
        if not jnp.issubdtype(output.dtype, jnp.floating):
            return None, "not a float tensor"
        kind, logits, _ = self.found.get(id(output), ("output", output, None))
        if kind == "sigmoid":
            return None, SIGMOID
        if logits.ndim < 2:
            return None, "no class axis (a rank below 2)"
        if logits.shape[-1] == 1:
            return None, "one entry on its last axis: no classes to compare"
        return logits, None


@compiled_on_its_own
def logit_statistics(logits):
    """``{kind: (mean, max)}`` of `kgrad.plan.tag_names.LOGIT_KINDS`, over every example and position.

    Example:

    >>> import jax.numpy as jnp
    >>> values = logit_statistics(jnp.array([[0.0, 0.0], [0.0, 10.0]]))
    >>> [round(float(v), 4) for v in values["logit_max"]], round(float(values["logit_top1_prob"][1]), 4)
    ([5.0, 10.0], 1.0)
    """
    logits = logits.astype(jnp.float32)
    largest = jnp.max(logits, axis=-1)
    log_sum_exp = logsumexp(logits, axis=-1)
    log_probabilities = logits - log_sum_exp[..., None]
    probabilities = jnp.exp(log_probabilities)
    # 0·log 0 = 0: a class with probability 0 adds nothing to the entropy.
    entropy = -jnp.sum(jnp.where(probabilities > 0, log_probabilities * probabilities, 0.0), -1)
    per_position = {
        "logit_max": largest,
        "logit_lse": log_sum_exp,
        "logit_entropy": entropy,
        "logit_top1_prob": jnp.exp(largest - log_sum_exp),
    }
    # Over examples (split over devices under a keras.distribution): a NaN stays a NaN.
    return {kind: (jnp.mean(values), nan_max(values)) for kind, values in per_position.items()}

