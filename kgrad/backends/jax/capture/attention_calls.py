"""The query and key projections of attention layers in a traced JAX step (``instruments=["attention"]``).

The JAX side of `kgrad.backends.tensorflow.capture.attention_calls` (read it
for the layers and the reasons): ``_compute_attention`` is replaced on each
supported layer *instance* while the probed step is traced, and records the
projected q ``[B, T, N, H]``, k ``[B, S, K, H]``, the scale, the soft cap and a
function that builds the layer's own masks for a sub-batch, in ``jax.numpy``.
Which layers are scored, and the reasons for the others, are TensorFlow's
(`adapter_of` is shared in its words; only the masks' ops differ).
"""

import contextlib
import dataclasses
import inspect
import sys

import jax.numpy as jnp
import keras
from keras.src.backend.common.symbolic_scope import in_symbolic_scope

from kgrad.backends.common.calls import replaced_calls
from kgrad.backends.common.model_io import model_relative_path
from kgrad.plan import selection

_GEMMA_MODULE = "keras_hub.src.models.gemma.gemma_attention"
_SUPPORTED = (
    "kgrad scores MultiHeadAttention and GroupedQueryAttention (and subclasses that keep their "
    "_compute_attention, such as KerasHub's CachedMultiHeadAttention) and KerasHub's "
    "CachedGemmaAttention"
)


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """One call of an attention layer: ``name``, ``query``, ``key``, ``scale``, ``soft_cap``, ``mask_of``."""

    name: str
    query: object
    key: object
    scale: float
    soft_cap: object
    mask_of: object  # fn(query, key, examples) -> bool mask broadcastable to [examples, N, T, S], or None


@dataclasses.dataclass
class AttentionCapture:
    """What one forward pass showed: the calls, and why other attention layers have none."""

    calls: list = dataclasses.field(default_factory=list)
    reasons: dict = dataclasses.field(default_factory=dict)


def _rank_4(mask):
    """``mask`` as a bool ``[B, 1, T, S]`` (heads axis added as Keras' ``_masked_softmax`` adds it)."""
    mask = jnp.asarray(mask).astype(bool)
    while mask.ndim < 4:
        mask = jnp.expand_dims(mask, axis=-3)
    return mask


def _both(first, second):
    if first is None or second is None:
        return second if first is None else first
    return jnp.logical_and(first, second)


def _keras_arguments(layer, arguments):
    query, key = arguments["query"], arguments["key"]
    axes = getattr(layer, "_attention_axes", (1,))
    if query.ndim != 4 or tuple(axes) != (1,):
        return (
            f"attention over axes {tuple(axes)} of a rank-{query.ndim} query: kgrad scores "
            "attention over one sequence axis only"
        )
    mask, causal = arguments.get("attention_mask"), arguments.get("use_causal_mask", False)
    scale = getattr(layer, "_inverse_sqrt_key_dim", None) or layer._inverse_sqrt_head_dim

    def mask_of(query, key, examples):
        given = None if mask is None else _rank_4(mask)[:examples]
        # `call` leaves the causal mask to the kernel when it is the only one.
        return _both(given, _rank_4(layer._compute_causal_mask(query, key)) if causal else None)

    return query, key, scale, None, mask_of


def _gemma_arguments(layer, arguments):
    query, key, mask = arguments["q"], arguments["k"], arguments["attention_mask"]
    # Gemma 2 scales the query by the model width per head, not the head size.
    head_size = layer.head_dim
    if not layer.query_head_dim_normalize:
        head_size = layer.hidden_dim // layer.num_query_heads
    update_index = arguments.get("cache_update_index", 0)

    def mask_of(query, key, examples):
        if mask is None:
            return None
        sub_mask = jnp.asarray(mask[:examples]).astype(bool)
        if layer.use_sliding_window_attention:
            sub_mask = layer._mask_sliding_window(sub_mask, cache_update_index=update_index)
        return _rank_4(sub_mask)

    return query, key, 1.0 / float(head_size) ** 0.5, layer.logit_soft_cap, mask_of


def adapter_of(layer):
    """``(adapter, None)`` for a layer kgrad scores, ``(None, reason)`` for another attention layer."""
    for base in (keras.layers.MultiHeadAttention, keras.layers.GroupQueryAttention):
        if isinstance(layer, base):
            if type(layer)._compute_attention is not base._compute_attention:
                return None, f"{type(layer).__name__} computes its attention its own way ({_SUPPORTED})"
            return _keras_arguments, None
    module = sys.modules.get(_GEMMA_MODULE)  # KerasHub is optional
    gemma = None if module is None else module.CachedGemmaAttention
    if gemma is not None and isinstance(layer, gemma):
        if type(layer)._compute_attention is not gemma._compute_attention:
            return None, f"{type(layer).__name__} computes its attention its own way ({_SUPPORTED})"
        return _gemma_arguments, None
    if "Attention" in type(layer).__name__:
        return None, f"{type(layer).__name__} is not a layer kgrad knows how to score ({_SUPPORTED})"
    return None, None


def attention_layers(model):
    """``({name: (layer, adapter)}, {name: reason})`` over the layers of ``model``, named as on TensorFlow."""
    supported, reasons, layers = {}, {}, {}
    named = selection.report_names(model)
    paths = {}
    for name, layer in named.items():
        path = getattr(layer, "path", None)
        paths[name] = model_relative_path(model, layer) if isinstance(path, str) and path else name
    unique = {path for path in paths.values() if list(paths.values()).count(path) == 1}
    for name, layer in named.items():
        name = paths[name] if paths[name] in unique else name
        adapter, reason = adapter_of(layer)
        if adapter is not None:
            supported[name] = (layer, adapter)
        elif reason is not None:
            reasons[name], layers[name] = reason, layer
    # A block named "...Attention" that holds a scored layer is scored through it.
    scored = {id(layer) for layer, _ in supported.values()}
    return supported, {
        name: reason for name, reason in reasons.items()
        if not any(id(inner) in scored for inner in layers[name]._flatten_layers(include_self=False))
    }


def _recording(capture, name, adapter, layer):
    def wrap(original):
        signature = inspect.signature(original)
        count = [0]

        def compute_attention(*args, **kwargs):
            if not in_symbolic_scope():
                arguments = signature.bind(*args, **kwargs)
                arguments.apply_defaults()
                count[0] += 1
                call_name = name if count[0] == 1 else f"{name}#{count[0]}"
                found = adapter(layer, arguments.arguments)
                if isinstance(found, str):
                    capture.reasons[call_name] = f"{type(layer).__name__}: {found}"
                else:
                    capture.calls.append(AttentionCall(call_name, *found))
            return original(*args, **kwargs)

        return compute_attention

    return wrap


@contextlib.contextmanager
def intercept(model):
    """Records the attention calls of ``model`` while the block runs; yields an `AttentionCapture`.

    Example:

    >>> import keras, jax.numpy as jnp
    >>> x = keras.Input((3, 4))
    >>> model = keras.Model(x, keras.layers.MultiHeadAttention(2, 2, name="mha")(x, x))
    >>> with intercept(model) as capture:
    ...     _ = model(jnp.ones((1, 3, 4)))
    >>> [(call.name, call.query.shape) for call in capture.calls]
    [('mha', (1, 3, 2, 2))]
    """
    supported, reasons = attention_layers(model)
    capture = AttentionCapture(reasons=dict(reasons))
    replacements = [
        (layer, _recording(capture, name, adapter, layer)) for name, (layer, adapter) in supported.items()
    ]
    with replaced_calls(replacements, method="_compute_attention"):
        yield capture
