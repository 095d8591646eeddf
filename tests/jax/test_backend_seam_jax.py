"""The JAX backend against `kgrad.backends.interface`, as tests/test_backend_seam.py checks TensorFlow's.

The protocols there are a checklist: the backend module has every name, and
what its ``attach`` returns (the probe's and the guard's train steps, the
record buffers, the guard's check) has every method and attribute the
callbacks call, with the parameters the protocol names.
"""

import doctest
import inspect

import keras
import numpy as np
import pytest

import kgrad
from kgrad import backends
from kgrad.backends import interface
from kgrad.backends.common import public_functions
from kgrad.plan.options import GuardConfig, ProbeConfig
from test_backend_seam import (  # noqa: F401 (collected here, in the JAX run)
    test_tap_and_prediction_gradient_are_documented_once_and_call_the_backends_own,
)


def _protocol_members(protocol):
    names = {name for name in vars(protocol) if not name.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


def _has_the_protocol(obj, protocol, unused=()):
    """``[what is missing or differs]`` of ``obj`` against ``protocol`` (less the names ``unused``)."""
    wrong = []
    for name in sorted(_protocol_members(protocol) - set(unused)):
        if not hasattr(obj, name):
            wrong.append(f"no {name}")
            continue
        expected = vars(protocol).get(name)
        if callable(expected):
            wanted = list(inspect.signature(expected).parameters)[1:]  # without self
            given = inspect.signature(getattr(obj, name))
            try:  # called as the callbacks call it: the protocol's arguments, positionally
                given.bind(*wanted)
            except TypeError:
                wrong.append(f"{name}{given} cannot be called as {name}({', '.join(wanted)})")
    return wrong


def test_the_jax_backend_provides_every_name_of_the_interface():
    backend = backends.current()
    assert backend.NAME == "jax"
    assert [name for name in interface.BACKEND_NAMES if not hasattr(backend, name)] == []
    assert _protocol_members(interface.Backend) == set(interface.BACKEND_NAMES)


def test_public_names_of_the_backend_are_the_backends_own():
    backend = backends.current()
    for name in ("ProbeTape", "ProbingModel", "ProbeResult", "first_non_finite", "replay_step",
                 "value_and_grad"):
        assert getattr(kgrad, name) is getattr(backend, name), name


def test_the_examples_of_tap_and_prediction_gradient_run_on_jax():
    # Their one docstring lives outside kgrad/backends/jax, which is all of kgrad the JAX run collects.
    tests = [test for test in doctest.DocTestFinder().find(public_functions) if test.examples]
    assert sorted(test.name.rsplit(".", 1)[-1] for test in tests) == ["prediction_gradient", "tap"]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        runner.run(test)
    assert runner.failures == 0


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense")])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


@pytest.mark.parametrize("roles", [("probe",), ("guard",), ("probe", "guard")])
def test_what_attach_returns_has_the_protocols_the_callbacks_use(roles):
    backend = backends.current()
    model = _model()
    configs = {"probe": ProbeConfig(), "guard": GuardConfig()}
    before = model.train_function
    steps = {role: backend.attach(model, role, configs[role]) for role in roles}
    try:
        for role, step in steps.items():
            # kgrad.NonFiniteGuard never sets where its step starts: the guard checks every step.
            unused = ("start_at",) if role == "guard" else ()
            assert _has_the_protocol(step, interface.TrainingStep, unused) == []
            for buffer in step.pipelines().values():
                assert _has_the_protocol(buffer, interface.HandOver) == []
            for check in step.guard_states().values():
                assert _has_the_protocol(check, interface.GuardCheck) == []
        if "probe" in steps:
            assert set(steps["probe"].pipelines()) == {None}  # Keras' own step: one run, the model's
        if "guard" in steps:
            assert set(steps["guard"].guard_states()) == {None}
        # And it runs: one fit's execution through what attach installed.
        model.fit(np.ones((4, 3)), np.ones((4, 2)), batch_size=4, verbose=0)
    finally:
        for role in reversed(roles):
            backend.detach(model, role)
    assert model.train_function is before  # detach gives back what attach found
