"""`NonFiniteGuard(skip_spikes=True)` under `keras.distribution.DataParallel` (2 simulated CPU devices).

A subprocess: JAX's device count is fixed when it is imported. The same planted spike is
skipped, and the skipped step's per-weight values equal those of one device: with Keras' step,
and with a model's own step of two ``kgrad.value_and_grad`` parts (each part judged on its own).
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
    sys.path[:0] = [sys.argv[1], os.path.dirname(sys.argv[1])]  # tests/jax and tests
    from test_spike_skipping_data_parallel_jax import fit, fit_own_step
    print("RESULT " + json.dumps([fit(), fit_own_step()]))
""")


def _values_and_z_scores(skipped):
    """A `SkippedStep`'s values and, as ``z_<value>``, their z-scores (the sampled ones' too)."""
    return {**skipped.values, **{f"z_{name}": z for name, z in skipped.z_scores.items()}}


def fit():
    """``(skipped steps, iterations, the first skip's values and z-scores)`` of a run with one bad batch."""
    x = np.random.default_rng(0).uniform(-1, 1, (400, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    x[320:328] *= 1000.0  # step 40
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="out")])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16, spike_sample_every=1)
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[guard])
    return (
        [s.step for s in guard.skipped_steps],
        int(model.optimizer.iterations),
        _values_and_z_scores(guard.skipped_steps[0]),
    )


def fit_own_step():
    """``(skipped (step, part)s, both optimizers' iterations, the first skip's values and z-scores)``
    of the GAN.

    The GAN of tests/jax/test_spike_skipping_own_step_jax.py; the real examples of its step 20
    scaled x1000: the discriminator's part spikes, the generator's does not.
    """
    from test_spike_skipping_own_step_jax import _JaxGAN

    real, noise = _JaxGAN.data(24)
    real[20 * _JaxGAN.batch : 21 * _JaxGAN.batch] *= 1000.0
    gan = _JaxGAN.make(True)
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16, spike_sample_every=1)
    gan.fit((real, noise), batch_size=_JaxGAN.batch, shuffle=False, verbose=0, callbacks=[guard])
    return (
        [[s.step, s.part] for s in guard.skipped_steps],
        [int(gan.d_optimizer.iterations), int(gan.g_optimizer.iterations)],
        _values_and_z_scores(guard.skipped_steps[0]),
    )


@pytest.fixture(scope="module")
def on_two_devices():
    """``[fit(), fit_own_step()]``, run in a process with 2 devices under `DataParallel`."""
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
    return json.loads(line[len("RESULT ") :])


def _assert_values_equal(values, one_values):
    assert values.keys() == one_values.keys()
    for name, per_weight in one_values.items():
        assert values[name].keys() == per_weight.keys(), name
        for weight, value in per_weight.items():
            assert values[name][weight] == pytest.approx(value, rel=1e-5), (name, weight)


def test_a_spike_is_skipped_under_data_parallel_with_the_values_of_one_device(on_two_devices):
    steps, iterations, values = on_two_devices[0]
    one_steps, one_iterations, one_values = fit()
    assert steps == one_steps == [40] and iterations == one_iterations == 49
    # The sampled ones too, of the global update.
    assert {"z_update_ratio", "z_cos_grad_weight", "z_adam_rms"} <= set(values)
    _assert_values_equal(values, one_values)


def test_an_own_steps_spiking_part_is_skipped_under_data_parallel_as_on_one_device(on_two_devices):
    skipped, iterations, values = on_two_devices[1]
    one_skipped, one_iterations, one_values = fit_own_step()
    assert skipped == one_skipped == [[20, "discriminator"]]
    assert iterations == one_iterations == [23, 24]  # the discriminator's update at step 20 skipped
    assert {"z_update_ratio", "z_cos_grad_weight"} <= set(values)  # SGD: no adam_rms
    _assert_values_equal(values, one_values)
