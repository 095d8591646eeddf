"""One model, weights and batch probed on TensorFlow and on JAX (subprocesses): the same tags and values.

Keras picks one backend per process; the JAX run writes what its probe
recorded as JSON. Both runs start from the same weights (set from NumPy), so
every value of the first probed step must agree, for both ``statistics=``.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

pytest.importorskip("jax")

SCRIPT = """
    import json, sys
    import keras, numpy as np, kgrad
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,), name="features")
    hidden = keras.layers.Dense(4, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(2, name="out")(keras.ops.tanh(hidden))
    model = keras.Model(inputs, outputs, name="m")
    model.compile(keras.optimizers.SGD(0.1), "mse")
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    x = rng.normal(size=(8, 3)).astype("float32")
    y = rng.normal(size=(8, 2)).astype("float32")
    records = []
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[kgrad.GradientProbe(
        None, layers="all", statistics=sys.argv[1], every_n_steps=1, on_probe=records.append)])
    (record,) = records
    print(json.dumps({"scalars": record.scalars,
                      "histograms": {tag: h.tolist() for tag, h in record.histograms.items()}}))
"""


def _probe_on(backend, statistics):
    process = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), statistics], capture_output=True, text=True,
        timeout=300, env={**os.environ, "KERAS_BACKEND": backend},
    )
    assert process.returncode == 0, process.stderr[-3000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("statistics", ["default", "all"])
def test_tensorflow_and_jax_write_the_same_tags_with_the_same_values(statistics):
    assert keras.config.backend() == "tensorflow"
    tensorflow, jax = _probe_on("tensorflow", statistics), _probe_on("jax", statistics)
    assert sorted(jax["scalars"]) == sorted(tensorflow["scalars"])
    assert sorted(jax["histograms"]) == sorted(tensorflow["histograms"])
    for tag, value in tensorflow["scalars"].items():
        assert jax["scalars"][tag] == pytest.approx(value, rel=1e-4, abs=1e-6), tag
    for tag, histogram in tensorflow["histograms"].items():
        np.testing.assert_allclose(jax["histograms"][tag], histogram, rtol=1e-4, atol=1e-6, err_msg=tag)
