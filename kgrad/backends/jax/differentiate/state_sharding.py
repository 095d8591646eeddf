"""Where a JAX ``fit`` keeps the training state under a `keras.distribution`: kgrad's steps keep it there too.

Keras' JAX train function jits its step with the state's shardings as
``out_shardings`` (under `keras.distribution.DataParallel`, the variables on
the mesh and the batch split over its devices; the step is one program over
the global batch, GSPMD). kgrad's probed and guarded steps return the state
with the same shardings, so that Keras' next step, and the next epoch's,
find it where it expects it.

Example:

>>> import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> state_shardings(model) is None  # no keras.distribution set
True
"""

import keras


def state_shardings(model):
    """The shardings of ``model``'s training state (as Keras' train function keeps it), or ``None``."""
    if keras.distribution.distribution() is None:
        return None
    return model._get_state_sharding_spec()
