"""The private Keras names the plan uses: walking a layer's tree (``Layer._flatten_layers``).

Keras lists a model's layers publicly (``model.layers``) but not those a plain
layer tracks: this walk is the one private call of the backend-free planning
code, kept here so that a Keras release is one file to check. The backends
reach it through `kgrad.backends.common.keras_internals` (the plan imports no
backend). tests/test_import_rules.py checks that no other module calls it.

>>> import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
>>> [type(layer).__name__ for layer in flatten_layers(model, include_self=False)]
['InputLayer', 'Dense']
"""


def flatten_layers(layer, include_self=True, recursive=True):
    """``layer`` and every layer inside it, as Keras walks them (``Layer._flatten_layers``)."""
    return layer._flatten_layers(include_self=include_self, recursive=recursive)
