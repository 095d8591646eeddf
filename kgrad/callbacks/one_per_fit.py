"""One `kgrad.GradientProbe` and one `kgrad.NonFiniteGuard` per model and ``fit``, on every backend.

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
>>> claim(first, "GradientProbe")
>>> try:
...     claim(second, "GradientProbe")
... except ValueError as error:
...     print(str(error).split(".")[0])
Model 'm' already has a GradientProbe attached in this fit
"""

import weakref

from kgrad import backends
from kgrad.backends.common import attached

# model -> {kind: (the fit's params dict, id of the callback that claimed the model in it)}
_HOLDERS = weakref.WeakKeyDictionary()


def claim(callback, kind):
    """Notes ``callback`` as its model's ``kind`` in this fit, or raises if another one is.

    Call it first in ``on_train_begin`` (``model`` and ``params`` set). Nothing
    is written on the model: a fit that raises later leaves it as it was.

    Args:
        callback: The `kgrad.GradientProbe` or `kgrad.NonFiniteGuard`.
        kind: Its class's public name, for the message.

    Raises:
        ValueError: If another ``kind`` of this fit already claimed the model.
    """
    model, fit = callback.model, callback.params
    held = _HOLDERS.get(model, {}).get(kind)
    if held is not None and held[0] is fit and held[1] != id(callback):
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
    # The fit's params dict itself (a later fit's new dict can never be this one); the callback
    # by its id, so that the registry keeps no callback alive.
    _HOLDERS.setdefault(model, {})[kind] = (fit, id(callback))
