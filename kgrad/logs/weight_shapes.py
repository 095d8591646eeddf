"""The shapes of a probed model's weights, logged once per event file.

The report needs them to compare like with like: the gradient norm of a
normalization layer's gamma and beta (a few hundred numbers) is not
comparable with a kernel's (a few million), so `kgrad.report.health` judges the
layers with no weight of two or more dimensions among themselves. Shapes are
static: `kgrad.logs.writer.ProbeWriter` writes them from the host, as one
string summary of the kgrad plugin (so that TensorBoard's Text tab does not
list it); nothing is computed in the step.

Example:

>>> from kgrad.logs import weight_shapes
>>> text = weight_shapes.encode({"dense/kernel": (4, 2), "bn/gamma": (2,)})
>>> weight_shapes.decode(text)
{'dense/kernel': (4, 2), 'bn/gamma': (2,)}
"""

import json

#: The tag that holds them, in the ``kgrad`` run.
WEIGHT_SHAPES_TAG = "kgrad/weight_shapes"
#: The plugin its summary metadata names: the kgrad tab's (`kgrad.dashboard.plugin`).
PLUGIN_NAME = "kgrad"


def encode(shapes):
    """JSON ``{weight path: [dims]}`` of ``{weight path: shape}``."""
    return json.dumps({path: [int(dim) for dim in shape] for path, shape in shapes.items()})


def decode(text):
    """``{weight path: shape tuple}`` of `encode`'s text; ``{}`` for text that is not."""
    try:
        shapes = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(shapes, dict):
        return {}
    return {
        path: tuple(shape)
        for path, shape in shapes.items()
        if isinstance(shape, list) and all(isinstance(dim, int) for dim in shape)
    }


def latest(texts):
    """The shapes of the last `WEIGHT_SHAPES_TAG` in ``[(step, text)]``; ``{}`` if none."""
    return decode(texts[-1][1]) if texts else {}
