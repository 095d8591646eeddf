"""Turning a user's ``layers=`` argument into named operations of a model."""

import keras

from kgrad.plan import operations


def default_layer_filter(operation):
    """True for a leaf layer that owns weights (Dense, Conv2D, BatchNorm...).

    A recurrent layer (``LSTM``, ``GRU``, any ``keras.layers.RNN``) counts as
    one leaf and its cell is left out: the cell runs once per time step, and
    under ``tf.function`` inside a loop whose tensors a tape cannot reach.
    """
    if not isinstance(operation, keras.layers.Layer) or not operation.weights:
        return False
    if isinstance(operation, keras.layers.RNN):
        return True
    # Keras requires every RNN cell to define `state_size`.
    return not operations.children(operation) and not hasattr(operation, "state_size")


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
    candidates, keep = resolve_selection(model, layers, argument)
    if keep is None:
        return candidates
    return {name: op for name, op in candidates.items() if keep(op)}


def resolve_selection(model, layers, argument="layers"):
    """Like `resolve_layers`, leaving a predicate to be applied later.

    A predicate (also the default one, which looks at a layer's weights) is
    only meaningful once Keras has built the layer, and a subclassed model is
    often built by its first call, inside the probe. The predicate is
    therefore returned, to be applied to each operation when it runs.

    Returns:
        ``(operations_by_name, keep)``: the candidate operations, and
        ``keep(operation) -> bool``, or ``None`` when ``layers`` lists them.
    """
    named = operations.tappable_operations(model)
    canonical = _canonical_names(named)
    in_time_loop = _inside_recurrent_layers(model)
    if layers is None:
        layers = default_layer_filter
    if isinstance(layers, str) and layers == "all":
        layers = _every_operation
    if callable(layers) and not isinstance(layers, (str, keras.layers.Layer)):
        candidates = {
            name: operation
            for name, operation in named.items()
            if canonical[id(operation)] == name and id(operation) not in in_time_loop
        }
        return candidates, layers
    return _resolve_list(model, layers, argument, named, canonical, in_time_loop), None


def report_names(model):
    """Every layer and operation of ``model`` once, under the name kgrad reports it by.

    Its plain name when unique in the model, its path ``"outer/inner"`` otherwise.

    >>> import keras
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    >>> list(report_names(model))
    ['out']
    """
    named = operations.tappable_operations(model)
    canonical = _canonical_names(named)
    return {name: operation for name, operation in named.items() if canonical[id(operation)] == name}


def _inside_recurrent_layers(model):
    """``{id(operation): RNN layer}`` for the cells of the RNN layers and what they hold.

    A cell runs once per time step: under ``tf.function`` inside a
    ``tf.while_loop`` whose tensors a tape cannot reach, and once more before
    the loop on the first time step, only to infer the output's shape (Keras'
    ``rnn``; that output is discarded, so its dJ/d(output) is 0 whatever the
    cell learns). No call of a cell is its gradient; the RNN layer's own output
    is (every time step of it with ``return_sequences=True``).
    """
    inside = {}
    seen = set()

    def mark(operation, rnn):
        for child in operations.children(operation):
            if id(child) not in inside:
                inside[id(child)] = rnn
                mark(child, rnn)

    def find(operation):
        for child in operations.children(operation):
            if isinstance(child, keras.layers.RNN):
                mark(child, child)
            elif id(child) not in seen:
                seen.add(id(child))
                find(child)

    find(model)
    return inside


def _every_operation(operation):
    return True


def _canonical_names(named):
    """Reports every operation under one name: its plain name when unique."""
    canonical = {}
    for name, operation in named.items():
        if id(operation) not in canonical or "/" not in name:
            canonical[id(operation)] = name
    return canonical


def _resolve_list(model, layers, argument, named, canonical, in_time_loop):
    if isinstance(layers, (str, keras.layers.Layer)) or not hasattr(layers, "__iter__"):
        example = repr(layers) if isinstance(layers, str) else "'dense_1'"
        raise TypeError(
            f"`{argument}` must be None, 'all', a predicate or a list of layer "
            f"names / layer objects. Received: {argument}={layers!r}. "
            f"Pass a list, e.g. {argument}=[{example}]."
        )
    layers = list(layers)
    selected = {}
    for item in layers:
        if isinstance(item, str):
            if item not in named:
                raise ValueError(
                    f"`{argument}` names a layer that model '{model.name}' does "
                    f"not have: {item!r}. Received: {argument}={layers!r}. Use one of the "
                    f"available names: {_describe(named)}."
                )
            operation = named[item]
        elif isinstance(item, keras.Operation):
            if id(item) not in canonical:
                raise ValueError(
                    f"`{argument}` contains layer {item.name!r}, which is not part "
                    f"of model '{model.name}'. Received: {argument}={layers!r}. "
                    f"Pass a layer of this model; available names: {_describe(named)}."
                )
            operation = item
        else:
            raise TypeError(
                f"`{argument}` items must be layer names or layer objects. "
                f"Received: {argument}={layers!r}, whose item {item!r} is of "
                f"type {type(item).__name__}. Example: {argument}=['dense_1']."
            )
        name = canonical[id(operation)]
        if id(operation) in in_time_loop:
            rnn = in_time_loop[id(operation)]
            raise ValueError(
                f"`{argument}` asks for layer {name!r}, which runs inside the time loop of "
                f"recurrent layer {canonical[id(rnn)]!r}: once per time step (under "
                "tf.function inside a tf.while_loop, whose tensors a tape cannot reach) "
                "and once more only to infer its output shape, so no call of it has "
                f"the layer's gradient. Received: {argument}={layers!r}. Probe "
                f"{canonical[id(rnn)]!r} instead (with return_sequences=True its output, "
                "and dJ/d(output), has every time step)."
            )
        if name in selected:
            raise ValueError(
                f"`{argument}` lists layer {name!r} twice. Received: "
                f"{argument}={layers!r}. List each layer once."
            )
        selected[name] = operation
    return selected


def captured_layers(model, plan):
    """What the probing step captures for a plan (its ``probe`` and ``guard`` configs): ``layers=``.

    The probe's layers, the guard's when it checks layers, or their union.
    """
    guard = plan.guard
    if guard is not None and not guard.checks_layers:
        guard = None  # the sentinel (loss, weight gradients) needs no activation captured
    parts = [part.layers for part in (plan.probe, guard) if part is not None]
    if not parts:
        return []
    if len(parts) == 1 or parts[0] is parts[1]:
        return parts[0]
    # Probe and guard watch different layers: capture the union.
    wanted = {id(operation) for layers in parts for operation in resolve_layers(model, layers).values()}
    return lambda operation: id(operation) in wanted
