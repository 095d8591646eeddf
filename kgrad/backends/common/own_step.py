"""A model with a ``train_step`` of its own, and the optimizers such a step may use.

Backend-free: a GAN or a VAE differentiates inside its own step on every
backend; kgrad asks the same two questions of it on each.
"""

import inspect

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


def check_stateless_train_step(model, callback):
    """Refuses, before ``fit`` starts on JAX, a ``train_step(self, data)`` written for TensorFlow.

    Keras' JAX trainer calls ``train_step(state, data)`` (a stateless step); a
    one-argument step, as TensorFlow's ``train_step(self, data)`` with a
    ``GradientTape`` (or a `kgrad.ProbeTape`), fails inside the first step with
    a ``TypeError`` that names kgrad's frames.

    Raises:
        TypeError: Naming the method and what to write on JAX.
    """
    try:
        parameters = inspect.signature(type(model).train_step).parameters.values()
    except (TypeError, ValueError):
        return
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL for p in parameters) or len(positional) != 2:
        return  # (self, state, data), or a signature kgrad cannot judge
    name = f"{type(model).__name__}.train_step"
    raise TypeError(
        f"{name}{inspect.signature(type(model).train_step)} takes the batch alone, as a "
        "TensorFlow train_step does; on Keras' JAX backend fit calls train_step(state, data) and "
        "the step is stateless (Keras' guide \"Customizing what happens in fit() with JAX\"). "
        f"Write it that way, with kgrad.value_and_grad(...) in place of jax.value_and_grad(...), "
        f"and pass kgrad.{callback}(...) to fit; or run this model with KERAS_BACKEND=tensorflow, "
        "where kgrad.ProbeTape replaces tf.GradientTape."
    )
