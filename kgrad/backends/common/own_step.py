"""A model with a ``train_step`` of its own, and the optimizers such a step may use.

Backend-free: a GAN or a VAE differentiates inside its own step on every
backend; kgrad asks the same two questions of it on each.
"""

import keras


def has_own_train_step(model):
    """Whether ``model``'s class defines a ``train_step`` of its own."""
    # `ProbingModel` sets the marker: its train_step is kgrad's, not the user's
    # (checked by attribute so that this module needs no backend's model class).
    probing_model = getattr(type(model), "_kgrad_probing_model", False)
    return not probing_model and type(model).train_step is not keras.Model.train_step


def candidate_optimizers(model):
    """The model's compiled optimizer and every optimizer that is an attribute of it, each once."""
    candidates = [getattr(model, "optimizer", None)] + [
        value for value in vars(model).values() if isinstance(value, keras.optimizers.Optimizer)
    ]
    unique = []
    for optimizer in candidates:
        if isinstance(optimizer, keras.optimizers.Optimizer) and all(optimizer is not o for o in unique):
            unique.append(optimizer)
    return unique
