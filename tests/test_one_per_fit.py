"""One `kgrad.NonFiniteGuard` per model and fit, on every backend (`kgrad.callbacks.one_per_fit`).

Backend-free: run on TensorFlow here and on JAX by tests/jax/test_guard_jax.py. (One
`kgrad.GradientProbe` per fit: tests/test_gradient_probe.py.)
"""

import warnings

import pytest

import kgrad
from fit_helpers import guard_data, middle_model


def test_two_guards_on_one_model_is_an_error():
    x, y = guard_data()
    model = middle_model(lambda t: t)
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="already has a NonFiniteGuard attached"):
        model.fit(x, y, callbacks=[kgrad.NonFiniteGuard(), kgrad.NonFiniteGuard()], verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The failed fit left nothing behind: a new fit installs cleanly.
        model.fit(x, y, callbacks=[kgrad.NonFiniteGuard()], verbose=0)
