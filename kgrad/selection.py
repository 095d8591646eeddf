"""Turning a user's ``layers=`` argument into named operations of a model."""

import keras

from kgrad import taps


def default_layer_filter(operation):
    """True for a leaf layer that owns weights (Dense, Conv2D, BatchNorm...)."""
    return (
        isinstance(operation, keras.layers.Layer)
        and not taps._children(operation)
        and bool(operation.weights)
    )


def _describe(names, limit=40):
    shown = sorted(names)
    text = ", ".join(repr(name) for name in shown[:limit])
    if len(shown) > limit:
        text += f", ... ({len(shown) - limit} more)"
    return text


def resolve_layers(model, layers, argument="layers"):
    """Resolves ``layers`` to an ordered ``dict`` of name -> operation.

    Args:
        model: The probed ``keras.Model``.
        layers: ``None`` (every leaf layer with weights), ``"all"`` (every layer
            and operation), a predicate ``fn(operation) -> bool``, or a list of
            names (``"dense"``, ``"outer/inner"``) and layer objects.
        argument: The argument name used in error messages.

    Raises:
        ValueError: For unknown names, duplicates or foreign layer objects.
        TypeError: For anything else.
    """
    named = taps.tappable_operations(model)
    # Report every operation under one name: its plain name when unique.
    canonical = {}
    for name, operation in named.items():
        if id(operation) not in canonical or "/" not in name:
            canonical[id(operation)] = name
    if layers is None:
        layers = default_layer_filter
    if isinstance(layers, str) and layers == "all":
        layers = lambda operation: True  # noqa: E731
    if callable(layers) and not isinstance(layers, (str, keras.layers.Layer)):
        selected = {}
        for name, operation in named.items():
            if canonical[id(operation)] == name and layers(operation):
                selected[name] = operation
        return selected
    if isinstance(layers, (str, keras.layers.Layer)) or not hasattr(layers, "__iter__"):
        raise TypeError(
            f"`{argument}` must be None, 'all', a predicate or a list of layer "
            f"names / layer objects. Received: {argument}={layers!r}. "
            f"Example: {argument}=['dense_1', 'conv1']."
        )
    selected = {}
    for item in layers:
        if isinstance(item, str):
            if item not in named:
                raise ValueError(
                    f"`{argument}` names a layer that model '{model.name}' does "
                    f"not have: {item!r}. Available names: {_describe(named)}."
                )
            operation = named[item]
        elif isinstance(item, keras.Operation):
            if id(item) not in canonical:
                raise ValueError(
                    f"`{argument}` contains layer {item.name!r}, which is not part "
                    f"of model '{model.name}'. Pass a layer of this model; "
                    f"available names: {_describe(named)}."
                )
            operation = item
        else:
            raise TypeError(
                f"`{argument}` items must be layer names or layer objects. "
                f"Received: {item!r} of type {type(item).__name__}."
            )
        name = canonical[id(operation)]
        if name in selected:
            raise ValueError(
                f"`{argument}` lists layer {name!r} twice. Received: "
                f"{argument}={list(layers)!r}. List each layer once."
            )
        selected[name] = operation
    return selected
