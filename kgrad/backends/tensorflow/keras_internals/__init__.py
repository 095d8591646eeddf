"""Every private Keras name kgrad's TensorFlow backend uses, in one place (a folder of its own,
imported by every stage folder and importing none of them).

A Keras release is one file to check: the TensorFlow backend reaches Keras
beyond its public API (``keras.src`` modules, underscored attributes of
models, layers, optimizers and tensors) only through these names, the
backend-free ones re-exported from `kgrad.backends.common.keras_internals`.
tests/test_import_rules.py checks that no other module imports ``keras.src``
or reads a private name these modules read.

>>> import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
>>> model.compile("sgd", "mse")
>>> compile_loss(model) is not None, call_has_training_arg(model)
(True, True)
"""

from keras.src import backend as _keras_backend
from keras.src.backend.tensorflow import nn as tensorflow_nn  # noqa: F401 (its cross-entropies)
from keras.src.losses.loss import unscale_loss_for_distribution  # noqa: F401

from kgrad.backends.common.keras_internals import (  # noqa: F401
    Functional,
    clip_gradients,
    compile_loss,
    flatten_layers,
    in_symbolic_scope,
    seed_generators,
    slots,
    variable_index,
)

#: ``name_scope(name, caller=...)``: Keras' name scope of the backend (the optimizer's variables).
name_scope = _keras_backend.name_scope


# -- models --------------------------------------------------------------------------------------


def symbolic_build(model, data_batch):
    """Builds ``model`` (and its metrics and loss) from a batch's structure, as ``fit`` does."""
    model._symbolic_build(data_batch=data_batch)


def builds_symbolically(model):
    """Whether ``model`` has Keras' symbolic build (a batch's structure builds it without running it)."""
    return hasattr(model, "_symbolic_build")


def distribute_strategy(model):
    """The strategy whose scope ``model`` was built in, or ``None`` when no scope was used."""
    return getattr(model, "_distribute_strategy", None)


def call_has_training_arg(model):
    """Whether ``model.call`` takes ``training``."""
    return model._call_has_training_arg


def compute_loss(model, **arguments):
    """``model.compute_loss`` as Keras' ``train_step`` calls it (its private entry point)."""
    return model._compute_loss(**arguments)


def loss_tracker(model):
    """The metric ``fit`` reports as ``loss``."""
    return model._loss_tracker


def own_losses(layer):
    """The ``add_loss`` terms of ``layer`` itself (not of the layers inside it)."""
    return layer._get_own_losses()


def runs_a_functional(model):
    """Whether a ``Sequential`` model given an input shape runs a ``Functional`` of its layers."""
    return model.__dict__.get("_functional") is not None


def causal_padding(layer):
    """The padding a ``Conv1D(padding="causal")`` adds before its input."""
    return layer._compute_causal_padding()


# -- tensors -------------------------------------------------------------------------------------


def keras_mask(tensor):
    """The mask Keras attached to ``tensor``, or ``None``."""
    return getattr(tensor, "_keras_mask", None)


def set_keras_mask(tensor, mask):
    """Attaches ``mask`` to ``tensor`` as Keras does."""
    tensor._keras_mask = mask


def keras_logits(tensor):
    """The logits Keras attached to a softmax or sigmoid output, or ``None``."""
    return getattr(tensor, "_keras_logits", None)


def logits_behind(output, op_type, name):
    """The logits Keras' cross-entropy ``name`` computes the loss from, given ``output``
    (a ``op_type`` output: ``"Softmax"``, ``"Sigmoid"``), or ``output`` itself when it has none."""
    logits, _ = tensorflow_nn._get_logits(output, False, op_type, name)
    return logits


# -- optimizers ----------------------------------------------------------------------------------


def optimizer_variables(optimizer):
    """The weights ``optimizer`` was built for, in the order of its slots."""
    return optimizer._trainable_variables


def tracks(optimizer, weight):
    """Whether ``optimizer`` was built for ``weight``."""
    return optimizer._var_key(weight) in getattr(optimizer, "_trainable_variables_indices", {})
