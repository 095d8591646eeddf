"""The operations of a Keras model that a probe can name: layers, nested models, ``keras.ops`` nodes.

Backend-free: Keras lists the same operations on every backend; each
backend's capture intercepts the ones a plan chose.
"""

import keras

from kgrad.plan.keras_internals import flatten_layers


def children(operation):
    """Direct sub-operations of a layer, in call order where Keras knows it."""
    if isinstance(operation, keras.Model) and hasattr(operation, "operations"):
        try:
            return list(operation.operations)
        except (AttributeError, ValueError):
            pass
    if isinstance(operation, keras.layers.Layer):
        return list(flatten_layers(operation, include_self=False, recursive=False))
    return []


def tappable_operations(model):
    """Maps every name a probe accepts to the operation it designates.

    Layers and non-layer operations of ``model`` and of the models nested in
    it are included (input layers are not). Each one is reachable by its
    path, ``"outer/inner"``, and also by its plain name when that name is
    unique in the whole model.

    Args:
        model: A ``keras.Model``.

    Returns:
        A ``dict`` from name to operation, in the order Keras lists them.
    """
    by_path = {}
    plain_names = {}

    def visit(operation, prefix):
        for child in children(operation):
            if isinstance(child, keras.layers.InputLayer):
                continue
            path = f"{prefix}{child.name}"
            if path in by_path:
                continue
            by_path[path] = child
            plain_names.setdefault(child.name, []).append(child)
            visit(child, f"{path}/")

    visit(model, "")
    names = dict(by_path)
    for name, operations in plain_names.items():
        if len({id(op) for op in operations}) == 1:
            names[name] = operations[0]
    return names
