"""Rows of the report and the kgrad tab in forward order when only some layers are captured.

The README's first example probes ``layers=["conv1", "dense_2"]`` on a model
conv1 → conv2 → dense_1 → dense_2: dJ/dw is logged for every layer, so the
rows of conv2 and dense_1 come from their weights and must sit between the
captured ones, as the report and the tab say ("forward order").
"""

import keras
import numpy as np

import kgrad
from kgrad.dashboard import events, views

FORWARD = ["conv1", "conv2", "dense_1", "dense_2"]


def _fit(log_dir, layers):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, activation="relu", name="conv1"),
        keras.layers.Conv2D(4, 3, activation="relu", name="conv2"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(8, activation="relu", name="dense_1"),
        keras.layers.Dense(3, name="dense_2"),
    ])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(16, 8, 8, 1)), rng.integers(0, 3, 16), batch_size=8, verbose=0,
              callbacks=[kgrad.GradientProbe(log_dir, layers=layers, every_n_steps=1)])
    return kgrad.read_logs(log_dir)


def test_rows_of_uncaptured_layers_sit_between_the_captured_ones(tmp_path):
    logs = _fit(str(tmp_path / "run"), ["conv1", "dense_2"])
    (run,) = kgrad.health_report(logs)
    assert [layer.layer for layer in run.layers] == FORWARD
    (name,) = logs
    run_dir = tmp_path / "run" / "kgrad"
    view = views.RunView(name, events.read_run(sorted(str(path) for path in run_dir.iterdir())))
    assert list(view.heatmap("weight_grad")["layers"]) == FORWARD


def test_every_layer_captured_keeps_the_activation_layers_in_place(tmp_path):
    logs = _fit(str(tmp_path / "run"), "all")
    (run,) = kgrad.health_report(logs)
    assert [layer.layer for layer in run.layers] == ["conv1", "conv2", "flatten", "dense_1", "dense_2"]
