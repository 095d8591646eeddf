"""In a step run op by op (``jit_compile=False``), kgrad's own computations compile once.

kgrad's statistics, checks and spike rule are compiled calls of their own
(`kgrad.backends.jax.summarize.compiled`): one program per shape. Before, each of
their operations compiled on its own, and each ``lax.cond`` they build compiled
again at every call: a second un-jitted fit of the same model with a new probe
(every statistic, two instruments) lowered 192 programs more than a plain fit, with a new `NonFiniteGuard` 16,
with ``skip_spikes=True`` 53. Counted with JAX's own monitoring events: every
program lowered to MLIR, whether or not the persistent compilation cache then
holds it.
"""

import contextlib

import jax
import keras
import numpy as np
import pytest

import kgrad

LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"

CALLBACKS = {
    "probe": lambda folder: kgrad.GradientProbe(folder, every_n_steps=1, statistics="all",
                                                instruments=["optimizer", "logits"]),
    "guard": lambda folder: kgrad.NonFiniteGuard(),
    "skip_spikes": lambda folder: kgrad.NonFiniteGuard(skip_spikes=True),
}


@contextlib.contextmanager
def programs_lowered():
    """``[count]`` of the programs JAX lowers inside the block."""
    count = [0]

    def listener(event, duration, **kwargs):
        del duration, kwargs
        count[0] += event == LOWERED

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def _fit(callbacks):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy", jit_compile=False)
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    model.fit(x, np.arange(64) % 3, batch_size=16, epochs=2, verbose=0, callbacks=callbacks)


@pytest.mark.parametrize("kind", CALLBACKS)
def test_a_second_fit_run_op_by_op_lowers_no_more_programs_than_a_plain_one(kind, tmp_path):
    make = CALLBACKS[kind]
    _fit([])
    _fit([make(str(tmp_path / "first"))])  # every program of these shapes, once
    with programs_lowered() as plain:
        _fit([])
    with programs_lowered() as watched:
        _fit([make(str(tmp_path / "second"))])
    assert watched[0] == plain[0], f"{kind}: {watched[0]} programs lowered, a plain fit {plain[0]}"
