"""One `kgrad.GradientProbe` per model and ``fit``: a second one is refused on every backend.

Keras hands every callback of one ``fit`` the same ``params`` dict, and each
``fit`` a new one: the dict names the fit. A probe from an earlier fit, also
one whose fit raised before its ``on_train_end``, never blocks a later fit.
The holder of each model is kept here, weakly, not on the model: a fit that
raises leaves the model as it was.

Example:

>>> import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)], name="m")
>>> class Probe(keras.callbacks.Callback): pass
>>> first, second, fit = Probe(), Probe(), {"epochs": 1}
>>> for probe in (first, second):
...     probe.set_model(model); probe.set_params(fit)
>>> refuse_a_second(first, "GradientProbe"); hold(first, "GradientProbe")
>>> try:
...     refuse_a_second(second, "GradientProbe")
... except ValueError as error:
...     print(str(error).split(".")[0])
Model 'm' already has a GradientProbe attached in this fit
"""

import weakref

from kgrad import backends
from kgrad.backends.common import attached

# model -> {kind: (the fit's params dict, the callback holding the model in it)}
_HOLDERS = weakref.WeakKeyDictionary()


def refuse_a_second(callback, kind):
    """Raises if another ``kind`` of this fit holds ``callback``'s model (see `hold`).

    Args:
        callback: The callback, in its ``on_train_begin`` (``model`` and ``params`` set).
        kind: Its class's public name, for the message.

    Raises:
        ValueError: If another ``kind`` of this fit already holds the model.
    """
    model = callback.model
    held = _HOLDERS.get(model, {}).get(kind)
    if held is not None and held[0] is callback.params and held[1] is not callback:
        # Keras calls no on_train_end after an error in on_train_begin: kgrad's callbacks are
        # taken out now, and the model left as before the fit (nothing kept for a later one).
        for role in ("probe", "guard"):
            backends.current().detach(model, role)
        for entry in attached.names(model):
            attached.pop(model, entry)
        _HOLDERS.pop(model, None)
        raise ValueError(
            f"Model '{model.name}' already has a {kind} attached in this fit. Received a second one; "
            f"pass a single {kind} per model (it can cover any set of layers)."
        )


def hold(callback, kind):
    """Notes ``callback`` as its model's ``kind`` in this fit, once it is attached."""
    _HOLDERS.setdefault(callback.model, {})[kind] = (callback.params, callback)


def release(callback, kind):
    """At the fit's end: the model is no longer held (a fit that raised is told apart by its ``params``)."""
    _HOLDERS.get(callback.model, {}).pop(kind, None)
