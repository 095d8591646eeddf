"""`NonFiniteGuard(skip_spikes=True)` under `keras.distribution.DataParallel` (2 simulated CPU devices).

A subprocess: JAX's device count is fixed when it is imported. The same planted spike is
skipped, and the skipped step's per-weight values equal those of one device.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import kgrad

SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import keras
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    sys.path.insert(0, sys.argv[1])
    from test_spike_skipping_data_parallel_jax import fit
    print("RESULT " + json.dumps(fit()))
""")


def fit():
    """``(skipped steps, iterations, the first skip's values)`` of a run with one bad batch."""
    x = np.random.default_rng(0).uniform(-1, 1, (400, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    x[320:328] *= 1000.0  # step 40
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="out")])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16)
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[guard])
    return (
        [s.step for s in guard.skipped_steps],
        int(model.optimizer.iterations),
        guard.skipped_steps[0].values,
    )


def test_a_spike_is_skipped_under_data_parallel_with_the_values_of_one_device():
    environment = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, os.path.dirname(os.path.abspath(__file__))],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    steps, iterations, values = json.loads(line[len("RESULT ") :])
    one_steps, one_iterations, one_values = fit()
    assert steps == one_steps == [40] and iterations == one_iterations == 49
    for name, per_weight in one_values.items():
        for weight, value in per_weight.items():
            assert values[name][weight] == pytest.approx(value, rel=1e-5), (name, weight)
