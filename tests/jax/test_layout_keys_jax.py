"""kgrad warns of a `LayoutMap` key that names a weight by the end of its path: it splits nothing.

Keras matches a key against a weight's whole path, so ``"up/kernel"`` leaves a
``Sequential``'s ``sequential/up/kernel`` whole on every device, silently
(`kgrad.backends.jax.layout_keys`). A one-device mesh is enough to see the
layout Keras gave each weight.
"""

import warnings

import jax
import keras
import numpy as np
import pytest

import kgrad
from kgrad.backends.jax.layout_keys import keys_matching_only_an_end


def test_a_key_is_reported_only_when_it_matches_no_whole_path_but_the_end_of_one():
    paths = ["sequential/up/kernel", "sequential/up/bias", "down/kernel", "sequential/attn/query/kernel"]
    keys = ["up/kernel", "down/kernel", "absent/kernel", "attn/(query|key)/kernel", ".*bias", "p/kernel"]
    assert keys_matching_only_an_end(keys, paths) == {
        "up/kernel": ["sequential/up/kernel"],
        "attn/(query|key)/kernel": ["sequential/attn/query/kernel"],
    }


@pytest.fixture
def model_parallel():
    def distribute(keys):
        mesh = keras.distribution.DeviceMesh((1,), ["model"], jax.devices()[:1])
        layouts = keras.distribution.LayoutMap(mesh)
        for key in keys:
            layouts[key] = (None, "model")
        keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layouts,
                                                                             batch_dim_name="model"))

    yield distribute
    keras.distribution.set_distribution(None)


def _layout_axes(variable):
    return tuple(keras.distribution.distribution().get_variable_layout(variable).axes)


def _fit_and_warnings(model, callback):
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    x = np.ones((4, 4), np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, x[:, :3], batch_size=4, epochs=1, verbose=0, callbacks=[callback])
    return [str(warning.message) for warning in caught if "LayoutMap" in str(warning.message)]


@pytest.mark.parametrize("attached", ["probe", "guard"])
def test_a_sequential_named_by_its_layer_gets_a_warning_with_the_whole_path(model_parallel, attached,
                                                                           tmp_path):
    model_parallel(["up/kernel"])
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="up")], name="seq")
    # Keras itself gives the kernel no layout: the key matches nothing.
    assert _layout_axes(model.layers[0].kernel) == (None, None)
    probe = kgrad.GradientProbe(str(tmp_path), every_n_steps=1)
    callback = probe if attached == "probe" else kgrad.NonFiniteGuard()
    (said,) = _fit_and_warnings(model, callback)
    assert "LayoutMap key 'up/kernel' matches no weight of model 'seq'" in said
    assert "'seq/up/kernel'" in said and "'.*up/kernel'" in said


def test_keys_that_match_whole_paths_get_no_warning(model_parallel, tmp_path):
    model_parallel(["seq/up/kernel", "absent/kernel"])
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="up")], name="seq")
    assert _layout_axes(model.layers[0].kernel) == (None, "model")
    assert _fit_and_warnings(model, kgrad.GradientProbe(str(tmp_path), every_n_steps=1)) == []
