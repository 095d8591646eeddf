"""One model, weights and batch probed on TensorFlow and on JAX (fresh processes): the same tags and values.

Keras picks one backend per process; the JAX run writes what its probe
recorded as JSON. Both runs start from the same weights (set from NumPy), so
every value of the second probed step must agree, for both ``statistics=``,
and with ``instruments=["optimizer", "logits", "per_example", "attention"]`` (a
softmax classifier of sequences, with a MultiHeadAttention, trained by Adam).
Log-magnitude histograms (the default) have the same edges and counts on both
backends, exactly; linear ones agree to 1e-4.
"""

import json
import textwrap

import keras
import numpy as np
import pytest

from kgrad.plan.histogram_buckets import log_magnitude_edges

pytest.importorskip("jax")

SCRIPT = """
    import json, sys
    import keras, numpy as np, kgrad
    keras.utils.set_random_seed(0)
    instruments = [name for name in sys.argv[2].split(",") if name]
    shape = (4, 3) if instruments else (3,)
    inputs = keras.Input(shape, name="features")
    if instruments:  # a sequence classifier trained by Adam: every instrument has something to say
        # No biases: the key's gets a gradient of rounding noise only (softmax ignores a shift).
        attended = keras.layers.MultiHeadAttention(2, 2, use_bias=False, name="mha")(inputs, inputs)
        hidden = keras.layers.Dense(4, activation="relu", name="hidden")(attended)
        pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
        outputs = keras.layers.Dense(3, activation="softmax", name="out")(keras.ops.tanh(pooled))
        loss, optimizer, classes = "sparse_categorical_crossentropy", keras.optimizers.Adam(0.01), 3
    else:
        hidden = keras.layers.Dense(4, activation="relu", name="hidden")(inputs)
        outputs = keras.layers.Dense(2, name="out")(keras.ops.tanh(hidden))
        loss, optimizer, classes = "mse", keras.optimizers.SGD(0.1), None
    model = keras.Model(inputs, outputs, name="m")
    model.compile(optimizer, loss)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    x = rng.normal(size=(8, *shape)).astype("float32")
    y = rng.normal(size=(8, 2)).astype("float32") if classes is None else np.arange(8) % classes
    records = []
    model.fit(x, y, batch_size=4, shuffle=False, verbose=0, callbacks=[kgrad.GradientProbe(
        None, layers="all", statistics=sys.argv[1], every_n_steps=1, on_probe=records.append,
        instruments=instruments, histogram_buckets=sys.argv[3])])
    record = records[-1]  # the second step: Adam's moments have a history
    print(json.dumps({"scalars": record.scalars,
                      "histograms": {tag: h.tolist() for tag, h in record.histograms.items()}}))
"""


@pytest.fixture(scope="module")
def python_on(preloaded_python, tmp_path_factory):
    """``{backend: PreloadedPython}``: fresh processes on each backend, forks of a preloaded one.

    TensorFlow's is the session's (this run's backend); JAX's imports Keras on JAX once for the
    module's four runs, not once a run (tests/forked_python.py).
    """
    from forked_python import PreloadedPython

    jax = PreloadedPython(tmp_path_factory.mktemp("preloaded_jax") / "server.stderr",
                          {"KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": ""})
    yield {"tensorflow": preloaded_python, "jax": jax}
    jax.close()


def _probe_on(python_on, tmp_path, backend, statistics, instruments="", histogram_buckets="log"):
    script = tmp_path / "probe_on.py"
    script.write_text(textwrap.dedent(SCRIPT))
    status, stdout, stderr = python_on[backend].run_script(
        script, [statistics, instruments, histogram_buckets], tmp_path / backend, timeout=300)
    assert status == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "statistics, instruments, histogram_buckets",
    [
        ("default", "", "log"),
        ("all", "", "log"),
        ("all", "", "linear"),
        ("default", "optimizer,logits,per_example,attention", "log"),
    ],
)
def test_tensorflow_and_jax_write_the_same_tags_with_the_same_values(
    python_on, tmp_path, statistics, instruments, histogram_buckets
):
    assert keras.config.backend() == "tensorflow"
    tensorflow = _probe_on(python_on, tmp_path, "tensorflow", statistics, instruments, histogram_buckets)
    jax = _probe_on(python_on, tmp_path, "jax", statistics, instruments, histogram_buckets)
    if instruments:
        assert {
            "adam_rms/out/kernel", "logit_entropy_mean/output", "global/noise_batch_sq_norm",
            "example_grad_norm_max/hidden/kernel", "update_rms/hidden/kernel",
            "example_grad_norm_max/mha/query/kernel", "attention_entropy/mha/head_1",
        } <= set(jax["scalars"])
    assert sorted(jax["scalars"]) == sorted(tensorflow["scalars"])
    assert sorted(jax["histograms"]) == sorted(tensorflow["histograms"])
    for tag, value in tensorflow["scalars"].items():
        assert jax["scalars"][tag] == pytest.approx(value, rel=1e-4, abs=1e-6), tag
    for tag, histogram in tensorflow["histograms"].items():
        if histogram_buckets == "log":
            # The same fixed edges, and every element in the same bucket: exactly equal.
            edges = np.append(np.asarray(histogram)[:, 0], histogram[-1][1]).astype(np.float32)
            np.testing.assert_array_equal(edges, log_magnitude_edges(), err_msg=tag)
            np.testing.assert_array_equal(jax["histograms"][tag], histogram, err_msg=tag)
        else:
            np.testing.assert_allclose(jax["histograms"][tag], histogram, rtol=1e-4, atol=1e-6, err_msg=tag)
