"""A `log_dir` that holds an earlier fit's kgrad logs is never mixed silently, and a
`GradientProbe` passed where nothing trains says so."""

import os
import warnings

import keras
import numpy as np
import pytest

import kgrad


def _fit(log_dir, model=None, epochs=2, **probe_options):
    """README example 1: 512 examples, batch 32, 2 epochs: steps 0..31, probed every 8."""
    x = np.random.default_rng(0).normal(size=(512, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    if model is None:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden"),
                                  keras.layers.Dense(2, activation="softmax", name="out")])
        model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0,
              callbacks=[kgrad.GradientProbe(log_dir, every_n_steps=8, **probe_options)])
    return model


def _steps(log_dir, run="kgrad"):
    return kgrad.read_logs(str(log_dir))[run]["scalars"]["weight_grad_norm/hidden/kernel"].steps.tolist()


def _event_files(folder):
    return sorted(name for name in os.listdir(folder) if name.startswith("events.out.tfevents"))


def test_a_second_fit_into_the_same_log_dir_is_refused_before_it_starts(tmp_path):
    log_dir = tmp_path / "run1"
    _fit(str(log_dir))
    files = _event_files(log_dir / "kgrad")
    with pytest.raises(FileExistsError) as error:
        _fit(str(log_dir))
    message = str(error.value)
    assert repr(str(log_dir / "kgrad")) in message and "overwrite=True" in message and "new log_dir" in message
    assert _steps(log_dir) == [0, 8, 16, 24]  # what the first fit wrote, alone
    assert _event_files(log_dir / "kgrad") == files


def test_overwrite_replaces_the_earlier_fits_logs(tmp_path):
    log_dir = tmp_path / "run1"
    _fit(str(log_dir))
    (log_dir / "train").mkdir()  # Keras' TensorBoard callback's run beside it: kept
    _fit(str(log_dir), overwrite=True)
    assert _steps(log_dir) == [0, 8, 16, 24]  # each step once
    assert len(_event_files(log_dir / "kgrad")) == 1
    assert sorted(os.listdir(log_dir)) == ["kgrad", "train"]


def test_a_later_fit_of_the_same_model_continues_its_run(tmp_path):
    log_dir = tmp_path / "run1"
    model = _fit(str(log_dir), epochs=1)
    _fit(str(log_dir), model=model, epochs=1)  # a new probe, as a notebook cell run again
    assert _steps(log_dir) == [0, 8, 16, 24]  # the optimizer's iterations go on: 16 steps, then 16 more


def test_an_earlier_run_of_a_tape_is_refused_too(tmp_path):
    (tmp_path / "generator" / "kgrad").mkdir(parents=True)
    (tmp_path / "generator" / "kgrad" / "events.out.tfevents.1.host").write_bytes(b"")
    with pytest.raises(FileExistsError, match=r"earlier fit: '.*generator/kgrad'"):
        _fit(str(tmp_path))
    assert not (tmp_path / "kgrad").exists()


def test_overwrite_must_be_a_bool():
    with pytest.raises(TypeError, match=r"`overwrite` must be True or False. Received: overwrite='yes'"):
        kgrad.GradientProbe("logs", overwrite="yes")


@pytest.mark.parametrize("method", ["evaluate", "predict"])
def test_a_probe_passed_to_evaluate_or_predict_warns_that_it_probes_nothing(tmp_path, method):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="out")])
    model.compile("sgd", "mse")
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")
    probe = kgrad.GradientProbe(str(tmp_path / "logs"))
    arguments = (x, y) if method == "evaluate" else (x,)
    with pytest.warns(UserWarning, match=rf"passed to model.{method}\(\), where no gradient is computed"):
        getattr(model, method)(*arguments, verbose=0, callbacks=[probe])
    assert not (tmp_path / "logs").exists()


def test_fits_own_validation_does_not_warn(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="out")])
    model.compile("sgd", "mse")
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, validation_data=(x, y), batch_size=4, verbose=0,
                  callbacks=[kgrad.GradientProbe(str(tmp_path / "logs"), every_n_steps=1)])
    assert not [w for w in caught if "GradientProbe" in str(w.message)]
    assert (tmp_path / "logs" / "kgrad").is_dir()
