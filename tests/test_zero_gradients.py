"""Layers that get no gradient at all: the report flags them, the heatmap draws them black.

Behind a ReLU layer that never fires (a bias of -100), dJ/dw is exactly 0. On
a log colour scale 0 has no place: it must not take the colour of the smallest
logged norm, which says "small" where there is nothing. And when no layer of
a run gets any gradient, "below 1e-3 of the largest" holds for none of them
(0 / 0); the report must still say that the gradients vanished.
"""

import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_dashboard_logs import headless_chromium, wait_for

import kgrad

X = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
Y = (X.sum(axis=1) > 0).astype("int32")
DEAD_BIAS = keras.initializers.Constant(-100.0)  # ReLU(x·W - 100) = 0 for these inputs


def branch_model():
    """A live branch and a dead one, concatenated: the dead layer's dJ/dw is 0."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    live = keras.layers.Dense(8, activation="relu", name="live")(inputs)
    dead = keras.layers.Dense(8, activation="relu", bias_initializer=DEAD_BIAS, name="dead")(inputs)
    outputs = keras.layers.Dense(2, name="out")(keras.layers.Concatenate(name="cat")([live, dead]))
    return keras.Model(inputs, outputs, name="branch")


def chain_model():
    """A dead layer in a chain: no kernel of the model gets any gradient."""
    keras.utils.set_random_seed(2)
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(8, activation="relu", name="first"),
            keras.layers.Dense(8, activation="relu", bias_initializer=DEAD_BIAS, name="dead"),
            keras.layers.Dense(2, name="out"),
        ],
        name="chain",
    )


def kernel_gradient_norms(model):
    """‖dJ/d(kernel)‖ per layer on the first batch, by a plain GradientTape."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(Y[:16], model(X[:16], training=True))
    kernels = [layer.kernel for layer in model.layers if hasattr(layer, "kernel")]
    return {
        kernel.path.split("/")[-2]: float(tf.norm(g))
        for kernel, g in zip(kernels, tape.gradient(loss, kernels))
    }


@pytest.fixture(scope="module")
def zero_logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero")
    expected = {}
    for make in (branch_model, chain_model):
        model = make()
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        expected[model.name] = kernel_gradient_norms(model)
        probe = kgrad.GradientProbe(str(root / model.name), every_n_steps=1)
        model.fit(X, Y, batch_size=16, epochs=2, shuffle=False, callbacks=[probe], verbose=0)
    return root, expected


def test_layers_without_gradient_are_vanishing_also_when_no_layer_gets_one(zero_logs):
    root, expected = zero_logs
    logs = kgrad.read_logs(str(root))
    # The logged norms of step 0 are the plain tape's, and exactly 0 behind the dead layer.
    for run, norms in expected.items():
        scalars = logs[f"{run}/kgrad"]["scalars"]
        for layer, norm in norms.items():
            logged = scalars[f"weight_grad_norm/{layer}/kernel"].values
            np.testing.assert_allclose(logged[0], norm, rtol=1e-5, atol=0)
    assert expected["branch"]["dead"] == 0 and expected["branch"]["live"] > 0
    assert set(expected["chain"].values()) == {0.0}

    health = {run.run: {row.layer: row for row in run.layers} for run in kgrad.health_report(logs)}
    branch, chain = health["branch/kgrad"], health["chain/kgrad"]
    assert branch["dead"].flags == ("vanishing", "dead") and dict(branch["dead"].first_flagged) == {
        "vanishing": 0,
        "dead": 0,
    }
    assert branch["live"].flags == () and branch["out"].flags == ()
    # No layer of the chain gets a gradient: every one has vanished, from step 0.
    assert [row.grad_norm for row in chain.values()] == [0.0, 0.0, 0.0]
    assert [row.flags for row in chain.values()] == [("vanishing",), ("vanishing", "dead"), ("vanishing",)]
    assert all(dict(row.first_flagged)["vanishing"] == 0 for row in chain.values())

    result = subprocess.run(
        [sys.executable, "-m", "kgrad.cli", "report", str(root)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1, result.stderr
    first_line = result.stdout.splitlines()[0]
    assert first_line.startswith("Thresholds: vanishing: the layer's gradient norm 0 or < 0.001 x")
    assert "chain/kgrad: first (vanishing), dead (vanishing dead), out (vanishing)" in result.stdout


@pytest.mark.slow
def test_heatmap_draws_a_logged_zero_black_and_says_so_in_the_legend(zero_logs, tmp_path):
    root, _ = zero_logs
    page = tmp_path / "report.html"
    command = [sys.executable, "-m", "kgrad.cli", "report", str(root), "--html", str(page)]
    assert subprocess.run(command, capture_output=True, timeout=300).returncode == 1
    driver = headless_chromium()
    try:
        driver.get(page.as_uri())
        wait_for(driver, "document.querySelector('.body[data-state=ready]')")
        assert driver.execute_script("return document.querySelector('.legend .zero-key').textContent") == "0"
        # The colour at the middle of each cell of the branch run's first step, row by row.
        colours = driver.execute_script(
            """
            const canvas = document.querySelector('section.run-column[data-run="branch/kgrad"] canvas');
            const layers = Number(canvas.dataset.layers), steps = Number(canvas.dataset.steps);
            const context = canvas.getContext('2d');
            const x = Math.floor(canvas.width / steps / 2);
            return [...Array(layers).keys()].map((row) => [...context.getImageData(
                x, Math.floor(((row + 0.5) / layers) * canvas.height), 1, 1).data.slice(0, 3)]);
            """
        )
        rows = driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map((r) => r.dataset.layer)",
            'section.run-column[data-run="branch/kgrad"] .row-label',
        )
        by_layer = dict(zip(rows, colours))
        assert by_layer["dead"] == [0, 0, 0]
        for layer in ("live", "out"):  # on the viridis scale: neither black, nor grey, nor red
            assert by_layer[layer] not in ([0, 0, 0], [225, 225, 225], [229, 57, 53]), by_layer
        driver.save_screenshot(str(tmp_path / "zero.png"))
    finally:
        driver.quit()
