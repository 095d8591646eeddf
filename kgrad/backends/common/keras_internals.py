"""Every private Keras name the backend-free code uses, in one place.

A Keras release is one file to check: what kgrad reads of Keras beyond its
public API (``keras.src`` modules, underscored attributes of layers, models
and optimizers) is reached only through these names; each backend's own
``keras_internals`` adds what only it uses. tests/test_import_rules.py checks
that no other module of kgrad imports ``keras.src`` or reads a private name
these modules read.

>>> import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
>>> [type(layer).__name__ for layer in flatten_layers(model, include_self=False)]
['InputLayer', 'Dense']
"""

import contextlib

from keras.src.backend.common.symbolic_scope import in_symbolic_scope  # noqa: F401
from keras.src.models.functional import Functional  # noqa: F401
from keras.src.models.model import functional_init_arguments  # noqa: F401

from kgrad.plan.keras_internals import flatten_layers  # noqa: F401 (the plan's walk, written once)


#: The ``MultiHeadAttention`` method (Keras', and KerasHub's Gemma layer's) that scores q·k: kgrad
#: replaces it on an instance while it records, and scores only layers that keep their class's.
ATTENTION_METHOD = "_compute_attention"


def computes_attention_as(layer, base):
    """Whether ``layer``'s class computes its attention with ``base``'s `ATTENTION_METHOD`."""
    return getattr(type(layer), ATTENTION_METHOD) is getattr(base, ATTENTION_METHOD)


def attention_scale(layer):
    """The factor an attention layer multiplies q·k by: 1/√(key size) (Keras' or KerasHub's attribute)."""
    return getattr(layer, "_inverse_sqrt_key_dim", None) or layer._inverse_sqrt_head_dim


def causal_mask(layer, query, key):
    """The causal mask a ``MultiHeadAttention`` builds for ``use_causal_mask=True``."""
    return layer._compute_causal_mask(query, key)


def mask_sliding_window(layer, mask, cache_update_index):
    """A KerasHub attention layer's mask, limited to its sliding window."""
    return layer._mask_sliding_window(mask, cache_update_index=cache_update_index)


def attention_axes(layer):
    """The axes a ``MultiHeadAttention`` attends over (``(1,)``, a sequence, by default)."""
    return getattr(layer, "_attention_axes", (1,))


def seed_generators(layer):
    """The ``keras.random.SeedGenerator``s ``layer`` owns (its dropout's, its noise's...)."""
    return getattr(layer, "_seed_generators", ())


@contextlib.contextmanager
def compile_loss_metrics_paused(compile_loss):
    """Within it, Keras' ``CompileLoss`` updates none of its per-output loss metrics."""
    # One `None` per metric, not an empty list: CompileLoss zips its losses
    # with its metrics, and an empty list stands for a single output, which
    # would drop every loss but the first.
    saved = compile_loss.__dict__.get("_metrics")
    if saved is not None:
        object.__setattr__(compile_loss, "_metrics", [None] * len(saved))
    try:
        yield
    finally:
        if saved is not None:
            object.__setattr__(compile_loss, "_metrics", saved)


def compile_loss(model):
    """The loss ``compile`` built (a callable ``(y, y_pred, sample_weight)``), or ``None``."""
    return getattr(model, "_compile_loss", None)


# -- optimizers ----------------------------------------------------------------------------------

# The lists of state Keras' optimizers keep per weight, by the name `slots` takes.
_SLOTS = {
    "momentums": "_momentums",  # Adam, AdamW, Nadam: m
    "velocities": "_velocities",  # v
    "velocity_hats": "_velocity_hats",  # AMSGrad's running max of v
    "m": "_m",  # Adamax
    "u": "_u",  # Adamax's infinity norm
}


def slots(optimizer, name):
    """One list of ``optimizer``'s state, per weight (in its variables' order): ``"momentums"``,
    ``"velocities"``, ``"velocity_hats"``, ``"m"`` or ``"u"`` (Adam, AdamW, Adamax, Nadam)."""
    return getattr(optimizer, _SLOTS[name])


def variable_index(optimizer, weight):
    """The index of ``weight`` among the variables ``optimizer`` was built for (its slots' order)."""
    return optimizer._get_variable_index(weight)


def clip_gradients(optimizer, gradients):
    """``gradients`` clipped as ``optimizer.apply`` clips them (``clipnorm``, ``clipvalue``...)."""
    return optimizer._clip_gradients(gradients)
