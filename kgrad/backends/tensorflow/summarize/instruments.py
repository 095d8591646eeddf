"""Per-example gradient norms and noise-scale sums of a probed step, as summaries.

`add_per_example_summaries` adds to a `kgrad.backends.tensorflow.summarize.summaries.SummaryBuilder`, on
device, inside the probed step:

=============================================  ==================================================
``example_grad_norm_<stat>/<weight path>``     statistics over the batch of ‖∇_w ℓ_i‖ (``mean``,
                                               ``max``... and ``example_grad_norm_hist/`` with
                                               histograms); ℓ_i as in `summarize.per_example`
``noise_example_sq_norm_mean/<layer>``         mean_i ‖B·∇ℓ_i‖² over the layer's weights
``noise_batch_sq_norm/<layer>``                ‖Σ_i ∇ℓ_i‖² = ‖∇J‖² (regularization left out)
``global/noise_example_sq_norm_mean``          the same over every trainable weight
``global/noise_batch_sq_norm``                 (only when every trainable weight is covered)
``global/batch_size``                          B, the (global) batch size
=============================================  ==================================================

The gradient noise scale is computed on the host from these sums
(`kgrad.report.noise_scale`), so that ``kgrad report`` can compute it
from the event files. Under ``tf.distribute``, norms are gathered over the
global batch and batch gradients summed over replicas.
"""

import keras
import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals
from kgrad.plan import operations
from kgrad.backends.tensorflow.handover import replicas
from kgrad.backends.tensorflow.summarize.per_example import PerExampleNorms, per_example_sq_norms


def record_layer_inputs(tape):
    """Makes an open `kgrad.ProbeTape` keep its layers' inputs; returns them (filled by the forward pass).

    Call it inside the ``with`` block, before the model runs. (Until
    ``ProbeTape`` takes ``record_inputs=True`` itself.)

    Example:

    >>> import keras, kgrad, tensorflow as tf
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    >>> with kgrad.ProbeTape(model) as tape:
    ...     inputs = record_layer_inputs(tape)
    ...     loss = tf.reduce_sum(model(tf.ones((3, 2))))
    >>> list(inputs), inputs["out"].shape
    (['out'], TensorShape([3, 2]))
    """
    recorder = tape._recorder
    recorder.record_inputs = True
    return recorder.layer_inputs


def coupling_layers(model):
    """Names of the layers that make examples interact (trainable BatchNormalization).

    Such a layer normalizes with the batch's statistics in training mode, so
    that dJ/d(output) of every layer before it mixes the examples' losses: no
    per-example gradient of the model is defined.
    """
    return [
        layer.name
        for layer in keras_internals.flatten_layers(model, include_self=False)
        if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable
    ]


def _base_name(name):
    """The layer of a captured call: ``dense#2`` -> ``dense``."""
    base, mark, count = name.rpartition("#")
    return base if mark and count.isdigit() else name


def probe_per_example_norms(model, probe, layer_inputs, unscale=None, output_gradients=None):
    """`PerExampleNorms` of every captured layer with trainable weights, by layer name.

    Args:
        model: The probed model.
        probe: The step's `kgrad.ProbeResult`.
        layer_inputs: ``dict`` call name -> layer input (`record_layer_inputs`).
        unscale: ``fn(δ) -> δ`` undoing loss scaling, or ``None``.
        output_gradients: Optional ``dict`` name -> dJ/d(output) that replaces
            ``probe.gradients[name]`` (e.g. dJ/dŷ from `kgrad.prediction_gradient`
            for an output whose gradient the tape did not see).

    Returns:
        ``dict`` layer name (as in ``grad_norm/<layer>``) -> `PerExampleNorms`,
        in forward order; a layer that is not supported has its ``reason``.
    """
    named = operations.tappable_operations(model)
    calls = {}
    for name in probe.activations:
        layer = named.get(_base_name(name))
        # A layer made of layers (MultiHeadAttention, a nested model): its
        # weights are its leaves', reported when those are captured.
        leaf = not operations.children(layer)
        if isinstance(layer, keras.layers.Layer) and layer.trainable_weights and leaf:
            calls.setdefault(_base_name(name), []).append(name)
    coupled = coupling_layers(model)
    output_gradients = output_gradients or {}
    results = {}
    for base, names in calls.items():
        if coupled:
            reason = (
                f"not defined: {_names(coupled)} (BatchNormalization in training mode) "
                "couples the examples of the batch"
            )
            results[base] = PerExampleNorms(None, None, {}, reason)
        elif any(name not in layer_inputs for name in names):
            results[base] = PerExampleNorms(None, None, {}, "its input was not recorded")
        else:
            # None: dJ/d(output) unknown (a softmax output whose loss the tape
            # did not see, see `kgrad.ProbeResult.gradients`); never zeros for it.
            deltas = [output_gradients.get(name, probe.gradients.get(name)) for name in names]
            inputs = [layer_inputs[name] for name in names]
            outputs = [probe.activations[name] for name in names]
            pre_activation = [
                _logits_gradient(named[base], probe, name) if name not in output_gradients else None
                for name in names
            ]
            results[base] = per_example_sq_norms(
                named[base], inputs, deltas, unscale, outputs, pre_activation
            )
    return results


def _logits_gradient(layer, probe, name):
    """dJ/dz of a softmax/sigmoid layer from the tape, when its loss took Keras' logits shortcut.

    The logits behind ``activation(z)`` are the layer's own ``z`` only when
    the activation is the layer's (``Dense(..., activation="softmax")``).
    """
    if getattr(layer, "activation", None) not in (keras.activations.softmax, keras.activations.sigmoid):
        return None
    return probe.logits_gradients.get(name)


def _relative_path(model, weight):
    # As `kgrad.backends.tensorflow.summarize.pipeline.model_relative_path`: tags shared by re-runs.
    prefix = f"{model.name}/"
    return weight.path[len(prefix) :] if weight.path.startswith(prefix) else weight.path


def _batch_gradient(result, key, given, unscale):
    """Σ_i ∇ℓ_i of one weight: the tape's gradient when it is that (no regularizer)."""
    variable = result.variables[key]
    gradient = given.get(id(variable))
    if gradient is None or getattr(variable, "regularizer", None) is not None:
        return replicas.sum_over_replicas(result.batch_gradients[key])
    gradient = tf.convert_to_tensor(gradient)  # an Embedding's IndexedSlices
    gradient = unscale(gradient) if unscale is not None else gradient
    # Each replica holds the gradient of its share of the loss.
    return replicas.sum_over_replicas(gradient)


def add_per_example_summaries(builder, model, probe, layer_inputs, weights, unscale=None,
                              output_gradients=None, gradients=None):
    """Adds the per-example norms and noise-scale sums of a probed step to ``builder``.

    Args:
        builder: A `kgrad.backends.tensorflow.summarize.summaries.SummaryBuilder`.
        model: The probed model (weight tags are paths relative to it).
        probe: The step's `kgrad.ProbeResult`.
        layer_inputs: ``dict`` call name -> layer input.
        weights: The trainable weights; the ``global/`` sums are written only
            when per-example norms cover every one of them.
        unscale: ``fn(δ) -> float δ`` undoing loss scaling, or ``None``.
        output_gradients: See `probe_per_example_norms`.
        gradients: Optional, the tape's gradients of ``weights`` (of the
            possibly scaled loss). For a weight without a regularizer, ‖∇J‖²
            is then taken from them (unscaled, summed over replicas) instead of
            being computed again from the layer's input and dJ/d(output): one
            product less per weight. Leave it out when losses other than the
            declared regularizers depend on the weights (``add_loss``).

    Returns:
        ``dict`` layer name -> reason, for the captured layers with weights
        that got no per-example norms.

    Example:

    >>> import keras, kgrad, tensorflow as tf
    >>> from kgrad.backends.tensorflow.summarize.summaries import SummaryBuilder
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    >>> with kgrad.ProbeTape(model) as tape:
    ...     inputs = record_layer_inputs(tape)
    ...     loss = tf.reduce_mean(model(tf.ones((4, 2))))
    >>> _ = tape.gradient(loss, model.trainable_weights)
    >>> builder = SummaryBuilder(histograms=False, bucket_count=1)
    >>> add_per_example_summaries(builder, model, tape.probe, inputs, model.trainable_weights)
    {}
    >>> scalars = dict(zip(builder.scalar_names, builder.scalars().numpy().tolist()))
    >>> scalars["example_grad_norm_max/out/bias"], scalars["global/batch_size"]
    (0.25, 4.0)
    """
    results = probe_per_example_norms(model, probe, layer_inputs, unscale, output_gradients)
    given = {} if gradients is None else {id(w): g for w, g in zip(weights, gradients) if g is not None}
    covered, model_example, model_batch, rows = set(), [], [], None
    for name, result in results.items():
        if result.reason is not None or not result.sq_norms:
            continue
        layer_example, layer_batch = [], []
        for key, sq_norms in result.sq_norms.items():
            variable = result.variables[key]
            sq_norms = tf.cast(replicas.gather_batch(sq_norms), tf.float32)
            builder.add_tensor("example_grad_norm", _relative_path(model, variable), tf.sqrt(sq_norms))
            batch_gradient = _batch_gradient(result, key, given, unscale)
            layer_example.append(sq_norms)
            layer_batch.append(tf.cast(tf.reduce_sum(tf.square(batch_gradient)), tf.float32))
            covered.add(id(variable))
        rows = tf.cast(tf.shape(layer_example[0])[0], tf.float32)
        # mean_i ‖B·∇ℓ_i‖² = B·Σ_i ‖∇ℓ_i‖²: the squared norm of example i's
        # gradient on its own, in the scale of ∇J (see noise_scale).
        example_sum = tf.reduce_sum(tf.add_n(layer_example))
        builder.add_scalar(f"noise_example_sq_norm_mean/{name}", rows * example_sum)
        builder.add_scalar(f"noise_batch_sq_norm/{name}", tf.add_n(layer_batch))
        model_example.append(example_sum)
        model_batch.extend(layer_batch)
    if rows is None:
        return {name: result.reason for name, result in results.items() if result.reason}
    if all(id(weight) in covered for weight in weights):
        builder.add_scalar("global/noise_example_sq_norm_mean", rows * tf.add_n(model_example))
        builder.add_scalar("global/noise_batch_sq_norm", tf.add_n(model_batch))
    builder.add_scalar("global/batch_size", rows)
    return {name: result.reason for name, result in results.items() if result.reason}


def _names(names, shown=3):
    """``'a', 'b', 'c' and 4 more``: a list a person reads on one line."""
    quoted = ", ".join(repr(name) for name in names[:shown])
    return quoted if len(names) <= shown else f"{quoted} and {len(names) - shown} more"


def describe_unsupported(reasons):
    """What `add_per_example_summaries` returned, one clause per reason naming a few of its layers.

    Example:

    >>> describe_unsupported({"a": "why", "b": "why", "c": "other"})
    "'a', 'b': why; 'c': other"
    """
    layers = {}
    for layer, reason in reasons.items():
        layers.setdefault(reason, []).append(layer)
    return "; ".join(f"{_names(names)}: {reason}" for reason, names in layers.items())
