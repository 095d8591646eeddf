"""A `LayoutMap` key that names a weight by the end of its path splits nothing: kgrad says so.

Keras matches each key of a ``keras.distribution.LayoutMap`` against a
variable's whole path (``re.fullmatch``). The paths of a ``Sequential``'s
weights start with the model's name (``sequential/up/kernel``), so the key
``"up/kernel"`` matches nothing, and the weight it was meant for stays whole
on every device, without a word: a model that fits its devices only because
it is split runs out of memory, and what kgrad measures per device is of a
model that is not split. (It misled kgrad's own tests once:
docs/sharded.md.) When a probe or a guard attaches under ``ModelParallel``,
each key that matches no whole path but the end of one gets a warning that
names the paths and the fix. A key that matches nothing at all is left alone:
a layout map may serve several models.

Example:

>>> keys_matching_only_an_end(["up/kernel", "down/kernel"], ["sequential/up/kernel", "down/kernel"])
{'up/kernel': ['sequential/up/kernel']}
"""

import re
import warnings

import keras

from kgrad.backends.jax.keras_internals import layout_map


def keys_matching_only_an_end(keys, paths):
    """``{key: [paths]}``: the keys that fully match none of ``paths`` but match the end of those."""
    found = {}
    for key in keys:
        if any(key == path or re.fullmatch(key, path) for path in paths):
            continue
        ends = [path for path in paths if re.search(f"(?:^|/)(?:{key})$", path)]
        if ends:
            found[key] = ends
    return found


def warn_of_keys_that_split_nothing(model):
    """Warns of each key of the ``ModelParallel`` layout map in use that misses a weight by a prefix."""
    layouts = layout_map(keras.distribution.distribution())
    if layouts is None:
        return
    paths = [variable.path for variable in model.weights]
    for key, ends in keys_matching_only_an_end(list(layouts), paths).items():
        shown = ", ".join(repr(path) for path in ends[:3]) + (", ..." if len(ends) > 3 else "")
        warnings.warn(
            f"kgrad: LayoutMap key {key!r} matches no weight of model '{model.name}', so the weights it "
            f"names stay whole on every device, not split. Keras matches a key against a weight's whole "
            f"path (re.fullmatch), and these paths only end with it: {shown}. Use the whole path as the "
            f"key (e.g. {ends[0]!r}), or {'.*' + key!r}.",
            stacklevel=3,
        )
