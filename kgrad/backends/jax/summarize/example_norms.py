"""Per-example gradient norms of one layer's weights on JAX, inside the backward pass of the probed step.

A per-example carrier (`example_tap`) is an identity on the layer's output,
like `kgrad.backends.jax.capture.carriers.tap_gradient`, that also holds the
layer's input ``a`` and weights (as residuals, without gradient). Its backward
pass receives dJ/d(output) ``δ`` for every example and gives its carrier, as
cotangent, ``[weights, B + 1]`` numbers: per weight, ‖∇_w ℓ_i‖² of each example
i, then ‖Σ_i ∇_w ℓ_i‖². Neither δ nor a per-example gradient leaves the pass:
only ``(B + 1)`` floats per weight do (a zero perturbation, as Flax's
``perturb``, would return a buffer the size of each layer's output).

ℓ_i is example i's contribution to the batch loss J, as on TensorFlow
(`kgrad.backends.tensorflow.summarize.per_example`): with Keras'
``sum_over_batch_size``, 1/B of its loss. The rules (all exact):

- ``Dense``: dJ/dz from δ through the layer's activation (one vector-Jacobian
  product at z = a·W + b, recomputed), then ‖a_i‖²·‖δ_i‖² (Goodfellow 2015), or
  with positions (sequences) the Gram contraction Σ_{t,s} (a_t·a_s)(δ_t·δ_s)
  (BackPACK's BatchL2Grad) when P² ≤ K·N, else the ``[B, K, N]`` gradients.
- ``Embedding``: Σ_{t,s} [id_t = id_s] δ_t·δ_s.
- ``EinsumDense``, ``Conv1D``, ``Conv2D``, ``LayerNormalization``: each example's
  weight gradients explicitly, by a vector-Jacobian product of the layer's own
  ``stateless_call`` on that example (``jax.vmap``): ``[B, weights]`` floats on
  probed steps.
"""

import functools

import jax
import jax.numpy as jnp
import keras

#: The layers that get per-example norms (exact types, as on TensorFlow), and how.
RULES = {
    keras.layers.Dense: "dense",
    keras.layers.Embedding: "lookup",
    keras.layers.EinsumDense: "explicit",
    keras.layers.Conv1D: "explicit",
    keras.layers.Conv2D: "explicit",
    keras.layers.LayerNormalization: "explicit",
}


def unsupported_reason(layer):
    """Why ``layer`` gets no per-example norms on JAX, or ``None``."""
    if isinstance(layer, keras.layers.BatchNormalization):
        return (
            "BatchNormalization in training mode normalizes with the batch's statistics, so each "
            "example's loss depends on every example: a per-example gradient is not defined."
        )
    if type(layer) not in RULES:
        return (
            f"{type(layer).__name__}: per-example gradient norms are not supported yet (supported: "
            "Dense, EinsumDense, Conv1D, Conv2D, Embedding, LayerNormalization)."
        )
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        return (
            f"{type(layer).__name__} with LoRA or quantization: not supported yet (its trainable "
            "weights are not the kernel the formula differentiates)."
        )
    return None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def example_tap(output, carrier, layer_input, weights, reduce):
    """``output`` unchanged; the carrier's gradient is ``reduce(layer_input, weights, dJ/d(output))``."""
    del carrier, layer_input, weights, reduce
    return output


def _forward(output, carrier, layer_input, weights, reduce):
    del carrier, reduce
    return output, (layer_input, weights)


def _backward(reduce, residuals, gradient):
    layer_input, weights = residuals
    # None: the input and the weights get no gradient from here (they entered as constants).
    return gradient, reduce(layer_input, weights, gradient), None, None


example_tap.defvjp(_forward, _backward)


def reducer(layer, inverse_scale=None):
    """``fn(a, (trainable, non_trainable), δ) -> [weights, B + 1]`` for ``layer`` (see the module)."""
    rule = RULES[type(layer)]

    def reduce(a, weights, delta):
        dtype = jnp.float64 if delta.dtype == jnp.float64 else jnp.float32
        delta = delta.astype(dtype)
        if inverse_scale is not None:  # statistics of the true loss, not of the scaled one
            delta = delta * inverse_scale.astype(dtype)
        if rule == "dense":
            parts = _dense(layer, a, weights, delta, dtype)
        elif rule == "lookup":
            parts = [_lookup(a, delta, layer.input_dim)]
        else:
            parts = _explicit(layer, a, weights, delta, dtype)
        return jnp.stack([jnp.append(sq_norms, batch) for sq_norms, batch in parts]).astype(jnp.float32)

    return reduce


def _dense(layer, a, weights, delta, dtype):
    trainable, _ = weights
    kernel = trainable[0].astype(dtype)
    a = a.astype(dtype)
    d = delta
    activation = layer.activation
    if activation is not None and activation is not keras.activations.linear:
        z = jnp.matmul(a, kernel)
        if layer.use_bias:
            z = z + trainable[1].astype(dtype)
        d = jax.vjp(activation, z)[1](delta)[0]
    rows = a.shape[0]
    a = a.reshape([rows, -1, a.shape[-1]])
    d = d.reshape([rows, -1, d.shape[-1]])
    parts = [(outer_sq_norms(a, d), jnp.sum(jnp.square(jnp.einsum("bpk,bpn->kn", a, d))))]
    if layer.use_bias:
        per_example = jnp.sum(d, axis=1)
        parts.append((jnp.sum(jnp.square(per_example), 1), jnp.sum(jnp.square(jnp.sum(per_example, 0)))))
    return parts


def outer_sq_norms(a, d):
    """‖Σ_p a[i, p] ⊗ d[i, p]‖² per example i, for ``a`` ``[B, P, K]`` and ``d`` ``[B, P, N]``.

    Example:

    >>> import jax.numpy as jnp
    >>> a = jnp.array([[[1.0], [2.0]]])    # B=1, P=2, K=1
    >>> d = jnp.array([[[3.0], [-1.0]]])   # gradient 1*3 + 2*(-1) = 1
    >>> [float(v) for v in outer_sq_norms(a, d)]
    [1.0]
    """
    positions, inner, outer = a.shape[1], a.shape[2], d.shape[2]
    if positions == 1:  # a vector per example: ‖a_i‖²·‖δ_i‖²
        return jnp.sum(jnp.square(a), (1, 2)) * jnp.sum(jnp.square(d), (1, 2))
    if positions * positions <= inner * outer:
        gram = jnp.einsum("bpk,bqk->bpq", a, a) * jnp.einsum("bpn,bqn->bpq", d, d)
        # A Gram contraction is a squared norm in exact arithmetic: rounding must not make it negative.
        return jnp.maximum(jnp.sum(gram, (1, 2)), 0.0)
    return jnp.sum(jnp.square(jnp.einsum("bpk,bpn->bkn", a, d)), (1, 2))


def _lookup(ids, delta, rows):
    count = delta.shape[0]
    ids = ids.reshape([count, -1]).astype(jnp.int32)
    d = delta.reshape([count, ids.shape[1], -1])
    same = (ids[:, :, None] == ids[:, None, :]).astype(d.dtype)
    sq_norms = jnp.maximum(jnp.sum(same * jnp.einsum("btd,bsd->bts", d, d), (1, 2)), 0.0)
    batch = jax.ops.segment_sum(d.reshape([-1, d.shape[-1]]), ids.reshape([-1]), num_segments=rows)
    return sq_norms, jnp.sum(jnp.square(batch))


def _per_example_gradients(layer, a, weights, delta):
    """Each example's gradients of ``layer``'s trainable weights: ``[[B, *weight shape]]``."""
    trainable, non_trainable = weights

    def one_example(a_i, d_i):
        def output(values):
            return layer.stateless_call(values, non_trainable, a_i[None])[0]

        out, pullback = jax.vjp(output, list(trainable))
        return pullback(d_i[None].astype(out.dtype))[0]

    return jax.vmap(one_example)(a, delta)


def gradients_reducer(layer, inverse_scale=None):
    """``fn(a, (trainable, non_trainable), δ) -> [B, weights' sizes]``: each example's weight gradients.

    For a layer called more than once in a step: its per-example gradient is
    the sum of every call's, so each call's carrier takes its share whole and
    the norms are taken once all calls are summed (`kgrad.backends.jax.summarize.per_example`).
    """

    def reduce(a, weights, delta):
        if inverse_scale is not None:  # the true loss's gradients, not the scaled one's
            delta = delta.astype(jnp.float32) * inverse_scale.astype(jnp.float32)
        gradients = _per_example_gradients(layer, a, weights, delta)
        return jnp.concatenate(
            [g.astype(jnp.float32).reshape([g.shape[0], -1]) for g in gradients], axis=1
        )

    return reduce


def _explicit(layer, a, weights, delta, dtype):
    per_example = _per_example_gradients(layer, a, weights, delta)
    parts = []
    for gradient in per_example:
        gradient = gradient.astype(dtype)
        sq_norms = jnp.sum(jnp.square(gradient.reshape([gradient.shape[0], -1])), 1)
        parts.append((sq_norms, jnp.sum(jnp.square(jnp.sum(gradient, 0)))))
    return parts
