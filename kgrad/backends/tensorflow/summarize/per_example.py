"""Per-example gradient norms of a layer's weights, from its input and dJ/d(output).

No per-example backward pass: for a `Dense` layer with input ``a_i`` and
dJ/d(pre-activation) ``δ_i`` of example i, the gradient of the weights is
``a_i δ_iᵀ`` and ‖a_i δ_iᵀ‖² = ‖a_i‖²·‖δ_i‖² (Goodfellow 2015, "Efficient
per-example gradient computations"). With extra axes (sequence positions,
convolution patches) the gradient is ``Σ_t a_t δ_tᵀ`` and its squared norm is
the contraction of two Gram matrices, ``Σ_{t,s} (a_t·a_s)(δ_t·δ_s)``
(BackPACK's BatchL2Grad); the explicit ``[B, K, N]`` gradients are used
instead when they are smaller than the ``[B, P, P]`` Gram matrices. Both are
exact.

**What is returned.** With ``δ`` the gradient of the batch loss ``J`` that the
tape gives (``probe.gradients[name]``), the result for example i is
‖∇_w ℓ_i‖², where ℓ_i is example i's *contribution* to J, so that
``Σ_i ∇_w ℓ_i = ∇_w J`` (the gradient the optimizer gets, less regularization
losses: those depend on the weights only, not on any example, and are left
out). With Keras' default reduction ``sum_over_batch_size`` and sample weights
``w_i``, ℓ_i = w_i·loss_i / B: the norms are 1/B times the norm of the gradient
of example i's weighted loss on its own. That is the quantity δ holds, and the
one that adds up to the batch gradient; `kgrad.report.noise_scale` rescales
it. A masked position (padding) has δ = 0 and adds nothing.

The formulas assume examples do not interact in the forward pass. A
``BatchNormalization`` layer in training mode breaks that for every layer
before it: `kgrad.backends.tensorflow.summarize.instruments` then reports nothing (see
`coupling_layers`).

**Mixed precision.** δ of a scaled loss must be unscaled: pass ``unscale``
(e.g. ``lambda t: tf.cast(t, tf.float32) / loss_scale``) or unscaled δ. The
norms are computed in float32 (float64 for float64 layers).
"""

import dataclasses

import tensorflow as tf

from kgrad.backends.tensorflow.summarize import _factors
from kgrad.backends.tensorflow.summarize._factors import Explicit, Lookup, Outer, Unsupported


@dataclasses.dataclass(frozen=True)
class PerExampleNorms:
    """The per-example squared gradient norms of one layer's weights.

    Attributes:
        sq_norms: ``dict`` weight attribute (``"kernel"``, ``"bias"``...) ->
            ``[B]`` tensor, ‖∇_w ℓ_i‖² (see the module docstring), or ``None``.
        batch_gradients: ``dict`` same keys -> Σ_i ∇_w ℓ_i (reshaped: only its
            norm is meaningful), or ``None``.
        variables: ``dict`` same keys -> the layer's variable.
        reason: ``None``, or why nothing could be computed.
    """

    sq_norms: dict
    batch_gradients: dict
    variables: dict
    reason: str = None


def per_example_sq_norms(layer, inputs, output_gradients, unscale=None, outputs=None,
                         pre_activation_gradients=None):
    """‖∇_w ℓ_i‖² for each trainable weight ``w`` of ``layer`` and each example i.

    Args:
        layer: A built Keras layer: ``Dense``, ``EinsumDense``, ``Conv1D``,
            ``Conv2D``, ``Embedding`` or ``LayerNormalization``.
        inputs: The layer's input (first argument of its ``call``), batch on
            axis 0; or a list of them, one per call of a shared layer.
        output_gradients: dJ/d(layer output) for each input, same structure.
        unscale: Optional ``fn(δ) -> δ`` (undoes loss scaling, casts).
        outputs: Optional, the layer's outputs, same structure: with them, the
            pre-activation gradient of a ReLU, tanh, sigmoid or softmax layer
            comes from the output, without recomputing the pre-activation.
        pre_activation_gradients: Optional, same structure: dJ/d(pre-activation)
            of the calls that have it (``None`` for the others), used instead
            of going back through the activation, e.g. the tape's dJ/d(logits)
            of a softmax output (`kgrad.ProbeResult.logits_gradients`).

    Returns:
        A `PerExampleNorms`; its ``reason`` says why when the layer is not
        supported (or a per-example gradient is not defined for it).

    Example:

    >>> import keras, tensorflow as tf
    >>> layer = keras.layers.Dense(2)
    >>> a = tf.constant([[1.0, 2.0], [0.0, 3.0]])
    >>> _ = layer(a)
    >>> result = per_example_sq_norms(layer, a, tf.constant([[1.0, 0.0], [0.0, 2.0]]))
    >>> result.sq_norms["kernel"].numpy().tolist(), result.sq_norms["bias"].numpy().tolist()
    ([5.0, 36.0], [1.0, 4.0])
    """
    calls = _calls(inputs, output_gradients)
    outputs = [None] * len(calls) if outputs is None else [c[1] for c in _calls(inputs, outputs)]
    if pre_activation_gradients is not None:
        given = [c[1] for c in _calls(inputs, pre_activation_gradients)]
        calls = [(a, delta if pre is None else pre) for (a, delta), pre in zip(calls, given)]
        outputs = [out if pre is None else _factors.PRE_ACTIVATION for out, pre in zip(outputs, given)]
    unscale = unscale or (lambda tensor: tf.cast(tensor, _factors.compute_dtype(tensor)))
    variables = {
        key: getattr(layer, key)
        for key in ("kernel", "bias", "embeddings", "gamma", "beta")
        if getattr(layer, key, None) is not None and getattr(layer, key).trainable
    }
    try:
        per_call = []
        for (a, delta), output in zip(calls, outputs):
            if delta is None:
                raise Unsupported("dJ/d(output) is unknown (the output is not on the tape).")
            per_call.append(_factors.factors_for(layer, a, _in_compute_dtype(unscale(delta)), output))
    except Unsupported as error:
        return PerExampleNorms(None, None, variables, str(error))
    sq_norms, batch_gradients = {}, {}
    for key in variables:
        if key not in per_call[0]:
            continue  # e.g. a weight the layer's call does not use
        sq_norms[key], batch_gradients[key] = _reduce(_combine([f[key] for f in per_call]))
    return PerExampleNorms(sq_norms, batch_gradients, {k: variables[k] for k in sq_norms})


def _calls(inputs, output_gradients):
    if isinstance(inputs, (list, tuple)):
        if not isinstance(output_gradients, (list, tuple)) or len(inputs) != len(output_gradients):
            raise ValueError(
                "`inputs` and `output_gradients` must both be tensors, or lists of the same "
                f"length (one per call). Received: {len(inputs)} inputs and "
                f"output_gradients={output_gradients!r}."
            )
        return list(zip(inputs, output_gradients))
    return [(inputs, output_gradients)]


def _in_compute_dtype(delta):
    return tf.cast(delta, _factors.compute_dtype(delta))


def _combine(parts):
    """One factored form for all the calls of a shared layer (their gradients add)."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], Outer):
        # Σ_c Σ_p a_cp δ_cpᵀ: the calls' positions are positions of one sum.
        return Outer(tf.concat([p.a for p in parts], 1), tf.concat([p.d for p in parts], 1))
    if isinstance(parts[0], Lookup):
        return Lookup(tf.concat([p.ids for p in parts], 1), tf.concat([p.d for p in parts], 1), parts[0].rows)
    return Explicit(tf.add_n([p.g for p in parts]))


def _reduce(factored):
    """``([B] squared norms, Σ_i g_i)`` of one factored per-example gradient."""
    if isinstance(factored, Outer):
        return outer_sq_norms(factored.a, factored.d), tf.einsum("bpmk,bpmn->mkn", factored.a, factored.d)
    if isinstance(factored, Lookup):
        return lookup_sq_norms(factored.ids, factored.d), _lookup_batch_gradient(factored)
    g = factored.g
    return tf.reduce_sum(tf.square(g), axis=list(range(1, g.shape.rank))), tf.reduce_sum(g, axis=0)


def outer_sq_norms(a, d):
    """‖Σ_p a[i, p] ⊗ d[i, p]‖² per example, summed over groups m.

    Args:
        a: ``[B, P, M, K]``.
        d: ``[B, P, M, N]``.

    Returns:
        ``[B]``: by Gram matrices when P² ≤ K·N, else from the explicit
        ``[B, M, K, N]`` gradients (same number, less memory).

    Example:

    >>> import tensorflow as tf
    >>> a = tf.constant([[[[1.0]], [[2.0]]]])   # B=1, P=2, M=1, K=1
    >>> d = tf.constant([[[[3.0]], [[-1.0]]]])  # gradient 1*3 + 2*(-1) = 1
    >>> outer_sq_norms(a, d).numpy().tolist()
    [1.0]
    """
    positions, inner, outer = a.shape[1], a.shape[3], d.shape[3]
    if positions == 1:
        # No positions (a Dense layer on vectors): ‖a_i‖²·‖δ_i‖², two
        # reductions; a batch of 1x1 matrix products is far slower on CPU.
        squares = tf.reduce_sum(tf.square(a), axis=[1, 3]) * tf.reduce_sum(tf.square(d), axis=[1, 3])
        return tf.reduce_sum(squares, axis=1)
    # Batched matrix products over (example, group): faster than tf.einsum on CPU.
    if a.shape[2] == 1:  # one group: a reshape, not a copy of the patches
        a, d = tf.reshape(a, [tf.shape(a)[0], 1, -1, inner]), tf.reshape(d, [tf.shape(d)[0], 1, -1, outer])
    else:
        a, d = tf.transpose(a, [0, 2, 1, 3]), tf.transpose(d, [0, 2, 1, 3])
    if positions is not None and positions * positions <= inner * outer:
        a_gram = tf.matmul(a, a, transpose_b=True)  # [B, M, P, P]
        d_gram = tf.matmul(d, d, transpose_b=True)
        squared = tf.reduce_sum(a_gram * d_gram, axis=[1, 2, 3])
    else:
        squared = tf.reduce_sum(tf.square(tf.matmul(a, d, transpose_a=True)), axis=[1, 2, 3])
    # A Gram contraction is a squared norm in exact arithmetic; rounding must
    # not make it negative (its square root is taken).
    return tf.maximum(squared, 0)


def lookup_sq_norms(ids, d):
    """Per-example ‖Σ_{t: ids_t = k} d_t‖² summed over rows k: Σ_{t,s} [ids_t = ids_s] d_t·d_s.

    Args:
        ids: ``[B, T]`` integer rows looked up.
        d: ``[B, T, D]`` dJ/d(looked-up vectors).

    Example:

    >>> import tensorflow as tf
    >>> ids = tf.constant([[4, 4, 1]])
    >>> d = tf.constant([[[1.0], [2.0], [5.0]]])  # row 4 gets 1+2, row 1 gets 5
    >>> lookup_sq_norms(ids, d).numpy().tolist()
    [34.0]
    """
    same = tf.cast(tf.equal(ids[:, :, tf.newaxis], ids[:, tf.newaxis, :]), d.dtype)
    return tf.maximum(tf.reduce_sum(same * tf.einsum("btd,bsd->bts", d, d), axis=[1, 2]), 0)


def _lookup_batch_gradient(lookup):
    width = lookup.d.shape[-1]
    return tf.math.unsorted_segment_sum(
        tf.reshape(lookup.d, [-1, width]), tf.reshape(lookup.ids, [-1]), lookup.rows
    )
