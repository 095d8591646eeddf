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


def test_batches_do_not_sync_the_model_state(tmp_path):
    # `Callback.model` copies the trainer's state into the variables on JAX (a
    # device read, and the end of asynchronous dispatch); the probe must not
    # ask for it on every batch.
    def state_syncs(probed, samples):
        model = _model()
        syncs = []
        original = model.jax_state_sync

        def counted():
            syncs.append(1)
            return original()

        object.__setattr__(model, "jax_state_sync", counted)
        callbacks = [kgrad.GradientProbe(str(tmp_path / str(samples)), every_n_steps=1000)] if probed else []
        model.fit(np.ones((samples, 3), "float32"), np.ones((samples, 1), "float32"), batch_size=4,
                  epochs=2, verbose=0, callbacks=callbacks)
        return len(syncs)

    # What the probe adds is per fit (installing it), not per batch: the same
    # with 20 batches an epoch as with 5.
    added_to_short_fit = state_syncs(True, 20) - state_syncs(False, 20)
    added_to_long_fit = state_syncs(True, 80) - state_syncs(False, 80)
    assert added_to_long_fit == added_to_short_fit, (added_to_short_fit, added_to_long_fit)
