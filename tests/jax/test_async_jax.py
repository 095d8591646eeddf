"""On JAX, a probe lets Keras dispatch asynchronously and reads the device only after steps that probed."""

import types

import jax
import keras
import numpy as np

import kgrad
from kgrad.backends.jax.handover import records as records_module


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="hidden"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def test_keras_dispatches_the_probe_asynchronously():
    callbacks = keras.callbacks.CallbackList([kgrad.GradientProbe(None)], model=_model())
    assert callbacks._async_train


def test_the_device_is_read_only_after_executions_that_probed(monkeypatch, tmp_path):
    reads = []

    def counted_device_get(arrays):
        reads.append(len(arrays))
        return jax.device_get(arrays)

    monkeypatch.setattr(records_module, "jax", types.SimpleNamespace(device_get=counted_device_get))
    delivered = []
    model = _model()
    # 10 steps an epoch, 2 epochs: steps 0, 4, 8, 12, 16 are probed.
    model.fit(np.ones((40, 3), "float32"), np.ones((40, 1), "float32"), batch_size=4, epochs=2, verbose=0,
              callbacks=[kgrad.GradientProbe(str(tmp_path), every_n_steps=4, on_probe=delivered.append)])
    assert [record.step for record in delivered] == [0, 4, 8, 12, 16]
    assert sum(reads) == 5 and len(reads) <= 5  # one device read per probed record, at most
