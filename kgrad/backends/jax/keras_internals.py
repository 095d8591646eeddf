"""Every private Keras name kgrad's JAX backend uses, in one place: a Keras release is one file to check.

Keras 3 has no hooks into its JAX trainer, so kgrad reaches into it: the
metrics update of ``JAXTrainer.train_step``, the state a jitted step takes and
its shardings, a ``ModelParallel``'s layout map, a layer tree walk, the
optimizer's clipping and the variable index of its slots, the symbolic scope
in which Keras builds a model (where kgrad taps nothing), and the classes
``Functional``, ``Softmax`` and ``Sigmoid``; those the backends share come from
`kgrad.backends.common.keras_internals`. ``tests/test_import_rules.py`` checks that no other module
imports ``keras.src`` or reads a private name these modules read.

Example:

>>> import keras
>>> model = keras.Sequential([keras.layers.Dense(1, name="d")])
>>> [layer.name for layer in flatten_layers(model)], in_symbolic_scope(), state_shardings(model)
(['d'], False, None)
"""

import keras
from keras.src.ops.nn import Sigmoid, Softmax  # noqa: F401

from kgrad.backends.common import keras_internals as common
from kgrad.backends.common.keras_internals import (  # noqa: F401
    Functional,
    clip_gradients,
    in_symbolic_scope,
    slots,
    variable_index,
)


def update_metrics_variables(model, metrics_variables, loss, x, y, y_pred, sample_weight):
    """``(logs, metrics variables)`` after one step, as ``JAXTrainer.train_step`` updates them."""
    return model._update_metrics_variables(metrics_variables, loss, x, y, y_pred, sample_weight)


def layout_map(distribution):
    """The `keras.distribution.LayoutMap` of a ``ModelParallel`` distribution, or ``None`` (any other)."""
    return getattr(distribution, "_layout_map", None)


def state_shardings(model):
    """Where a JAX ``fit`` keeps the training state under a ``keras.distribution``, or ``None``.

    Keras' JAX train function jits its step with the state's shardings as
    ``out_shardings`` (under ``keras.distribution.DataParallel``, the variables
    on the mesh and the batch split over its devices; the step is one program
    over the global batch, GSPMD). kgrad's probed and guarded steps return the
    state with the same shardings, so that Keras' next step, and the next
    epoch's, find it where it expects it.
    """
    if keras.distribution.distribution() is None:
        return None
    return model._get_state_sharding_spec()


def jax_state(model):
    """The model's ``(trainable, non-trainable, optimizer, metrics)`` values, as its step gets them."""
    return model._get_jax_state(
        trainable_variables=True, non_trainable_variables=True, optimizer_variables=True,
        metrics_variables=True,
    )


def flatten_layers(model, recursive=True):
    """The layers inside ``model`` (not itself), depth first."""
    return list(common.flatten_layers(model, include_self=False, recursive=recursive))


def iterations_position(optimizer):
    """``(index, accumulation)``: where the step counter is among ``optimizer.variables``, and by what Keras divides it.

    The counter's own variable: with ``gradient_accumulation_steps`` Keras'
    ``iterations`` property is a new tensor (the counter divided by those
    steps), not the variable; a ``LossScaleOptimizer`` counts in its inner
    optimizer's. ``accumulation`` is 1 without accumulation.
    """
    inner = optimizer
    while getattr(inner, "inner_optimizer", None) is not None:
        inner = inner.inner_optimizer
    counter = inner._iterations
    index = next(k for k, variable in enumerate(optimizer.variables) if variable is counter)
    return index, inner.gradient_accumulation_steps or 1
