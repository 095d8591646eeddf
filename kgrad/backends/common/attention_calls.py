"""The query and key projections of attention layers, for ``instruments=["attention"]``, on every backend.

An attention layer hands its projected query and key to an inner method,
``_compute_attention``, which may score them with a fused kernel
(``ops.dot_product_attention``) that never shows the scores. Replacing that
method on the layer *instance* while a probe records (as `kgrad.backends.common.calls`
replaces ``call``) sees its arguments: the projected q ``[B, T, N, H]``, k
``[B, S, K, H]`` and the layer's mask. Nothing is computed here: the scores are
computed from them in the probed step only (`kgrad.backends.common.attention_scores`),
on a sub-batch. Tracing is Python on every backend, so this is written once in
``keras.ops``; a backend says only which calls belong to its probed step (``recording``
of `intercept`: TensorFlow's graph being traced).

Layers kgrad scores as the layer itself does:

- ``keras.layers.MultiHeadAttention`` (also KerasHub's ``CachedMultiHeadAttention``
  of ``TransformerDecoder``/``TransformerEncoder``, GPT-2, BERT) and
  ``keras.layers.GroupedQueryAttention``, as long as their class keeps Keras'
  ``_compute_attention``: scale 1/√(head size), the mask ``call`` passes and the
  causal mask when ``call`` leaves it to the kernel;
- KerasHub's ``CachedGemmaAttention`` (Gemma): grouped key/value heads, its query
  scaling, logit soft-cap and sliding window.

Any other layer whose class name says ``Attention`` (and holds none of these)
is listed with the reason, for one warning: never a zero.
"""

import contextlib
import dataclasses
import inspect
import sys

import keras
from keras import ops

from kgrad.backends.common import keras_internals
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
    """One call of an attention layer, as its ``_compute_attention`` received it.

    Attributes:
        name: The layer's path in the model, as its weights' paths begin
            (``transformer_layer_0/self_attention``; ``name#2`` for its second call).
        query: The projected query, ``[B, T, N, H]``.
        key: The projected key, ``[B, S, K, H]`` (K divides N).
        scale: What q·k is multiplied by.
        soft_cap: c of c·tanh(s/c), or ``None``.
        mask_of: ``fn(query, key, examples) -> bool mask broadcastable to
            [examples, N, T, S], or None``: the layer's own masks of the first
            ``examples`` examples, built only when called (in the probed step).
    """

    name: str
    query: object
    key: object
    scale: float
    soft_cap: object
    mask_of: object

    def allowed(self, query, key, examples):
        """Which keys each query may attend to, for the first ``examples`` examples (or ``None``: all)."""
        return self.mask_of(query, key, examples)


@dataclasses.dataclass
class AttentionCapture:
    """What one forward pass showed: the calls, and why other attention layers have none."""

    calls: list = dataclasses.field(default_factory=list)
    reasons: dict = dataclasses.field(default_factory=dict)


def _gemma_class():
    # KerasHub is optional: a model can only hold its layers once it is imported.
    module = sys.modules.get(_GEMMA_MODULE)
    return None if module is None else module.CachedGemmaAttention


def _rank_4(mask):
    """``mask`` as a bool ``[B, 1, T, S]`` (heads axis added as Keras' ``_masked_softmax`` adds it)."""
    mask = ops.cast(mask, "bool")
    while ops.ndim(mask) < 4:
        mask = ops.expand_dims(mask, axis=-3)
    return mask


def _both(first, second):
    if first is None or second is None:
        return second if first is None else first
    return ops.logical_and(first, second)


def _keras_arguments(layer, arguments):
    """``(query, key, scale, soft_cap, mask_of)`` of a MultiHeadAttention or GroupedQueryAttention call.

    Or why not, as a string.
    """
    query, key = arguments["query"], arguments["key"]
    axes = keras_internals.attention_axes(layer)
    rank = ops.ndim(query)
    if rank != 4 or tuple(axes) != (1,):
        return (
            f"attention over axes {tuple(axes)} of a rank-{rank} query: kgrad scores "
            "attention over one sequence axis only"
        )
    mask, causal = arguments.get("attention_mask"), arguments.get("use_causal_mask", False)
    scale = keras_internals.attention_scale(layer)

    def mask_of(query, key, examples):
        given = None if mask is None else _rank_4(mask)[:examples]
        # `call` leaves the causal mask to the kernel when it is the only one.
        return _both(given, _rank_4(keras_internals.causal_mask(layer, query, key)) if causal else None)

    return query, key, scale, None, mask_of


def _gemma_arguments(layer, arguments):
    """The same for KerasHub's CachedGemmaAttention."""
    query, key, mask = arguments["q"], arguments["k"], arguments["attention_mask"]
    # Gemma 2 scales the query by the model width per head, not the head size.
    head_size = layer.head_dim
    if not layer.query_head_dim_normalize:
        head_size = layer.hidden_dim // layer.num_query_heads
    update_index = arguments.get("cache_update_index", 0)

    def mask_of(query, key, examples):
        if mask is None:
            return None
        sub_mask = ops.cast(mask[:examples], "bool")
        if layer.use_sliding_window_attention:
            sub_mask = keras_internals.mask_sliding_window(layer, sub_mask, update_index)
        return _rank_4(sub_mask)

    return query, key, 1.0 / float(head_size) ** 0.5, layer.logit_soft_cap, mask_of


def adapter_of(layer):
    """``(adapter, None)`` for a layer kgrad scores, ``(None, reason)`` for another attention layer.

    ``(None, None)`` for a layer that is not an attention layer.

    Example:

    >>> import keras
    >>> adapter_of(keras.layers.MultiHeadAttention(2, 2))[0].__name__
    '_keras_arguments'
    >>> adapter_of(keras.layers.Dense(2))
    (None, None)
    """
    keras_classes = (keras.layers.MultiHeadAttention, keras.layers.GroupQueryAttention)
    for base in keras_classes:
        if isinstance(layer, base):
            if not keras_internals.computes_attention_as(layer, base):
                return None, f"{type(layer).__name__} computes its attention its own way ({_SUPPORTED})"
            return _keras_arguments, None
    gemma = _gemma_class()
    if gemma is not None and isinstance(layer, gemma):
        if not keras_internals.computes_attention_as(layer, gemma):
            return None, f"{type(layer).__name__} computes its attention its own way ({_SUPPORTED})"
        return _gemma_arguments, None
    if "Attention" in type(layer).__name__:
        return None, f"{type(layer).__name__} is not a layer kgrad knows how to score ({_SUPPORTED})"
    return None, None


def _layer_path(model, layer, name):
    """The layer's path as its weights' paths start (``transformer_layer_0/self_attention``).

    Stable across runs, as weight tags are: without the model's own name, and
    without the names Keras numbers (``gpt2_backbone_1``) of the models around it.
    """
    path = getattr(layer, "path", None)
    return model_relative_path(model, layer) if isinstance(path, str) and path else name


def attention_layers(model):
    """``({name: (layer, adapter)}, {name: reason})`` over every layer of ``model``."""
    supported, reasons, layers = {}, {}, {}
    named = selection.report_names(model)
    paths = {name: _layer_path(model, layer, name) for name, layer in named.items()}
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
        if not any(id(inner) in scored
                   for inner in keras_internals.flatten_layers(layers[name], include_self=False))
    }


def _recording(capture, name, adapter, layer, recording):
    def wrap(original):
        signature = inspect.signature(original)
        count = [0]

        def compute_attention(*args, **kwargs):
            if not keras_internals.in_symbolic_scope() and recording():
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
def intercept(model, recording=None):
    """Records the attention calls of ``model`` while the block runs; yields an `AttentionCapture`.

    Args:
        model: The probed model.
        recording: ``fn() -> bool``: whether a call made now belongs to the probed
            step (TensorFlow: the graph being traced is the step's own), or
            ``None``: every call outside Keras' symbolic (shape-only) scope.

    Example:

    >>> import keras
    >>> x = keras.Input((3, 4))
    >>> model = keras.Model(x, keras.layers.MultiHeadAttention(2, 2, name="mha")(x, x))
    >>> with intercept(model) as capture:
    ...     _ = model(keras.ops.ones((1, 3, 4)))
    >>> [(call.name, tuple(call.query.shape)) for call in capture.calls]
    [('mha', (1, 3, 2, 2))]
    """
    supported, reasons = attention_layers(model)
    capture = AttentionCapture(reasons=dict(reasons))
    recording = recording or (lambda: True)
    replacements = [
        (layer, _recording(capture, name, adapter, layer, recording))
        for name, (layer, adapter) in supported.items()
    ]
    with replaced_calls(replacements, method=keras_internals.ATTENTION_METHOD):
        yield capture
