"""A tracker that raises, one that sleeps 2 s per call and one that hangs do not change training.

Three fits from the same weights: plain ``fit``, a probe writing TensorBoard
alone, and the same probe with the three bad sinks. The bad sinks' fit ends
with the plain fit's weights and the TensorBoard-only fit's event files, tag
for tag and value for value; each bad sink warns once when its first problem
shows, and says at the end how many records it lost. tests/jax runs the same
tests on Keras' JAX backend.
"""

import threading
import time
import warnings

import keras
import numpy as np
import pytest

import kgrad
from kgrad.backends.common import attached
from kgrad.sinks import worker

STEPS, EVERY = 12, 2
RECORDS = STEPS // EVERY


class Raising(kgrad.Sink):
    def write_record(self, record):
        raise ConnectionError("the tracker is down")


class Sleeping(kgrad.Sink):
    """Sleeps 2 s per call (wandb#8666's periodic stalls, exaggerated)."""

    def __init__(self):
        super().__init__(queue_size=2, close_timeout=1.0)
        self.steps = []

    def write_record(self, record):
        time.sleep(2)
        self.steps.append(record.step)


class Hanging(kgrad.Sink):
    """Blocks until the test lets it go: a tracker that never answers while fit runs."""

    def __init__(self):
        super().__init__(queue_size=3, close_timeout=0.0)
        self.release = threading.Event()

    def write_record(self, record):
        self.release.wait(60)


def _fit(callbacks, users_objects=None):
    """The weights after a fit; ``users_objects``, a dict, gets its model, optimizer and loss."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(6, activation="tanh", name="hidden"),
        keras.layers.Dense(1, name="out"),
    ])
    model.compile(keras.optimizers.Adam(0.01), keras.losses.MeanSquaredError())
    rng = np.random.default_rng(1)
    x = rng.normal(size=(STEPS * 4, 5)).astype("float32")
    y = rng.normal(size=(STEPS * 4, 1)).astype("float32")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    if users_objects is not None:
        users_objects.update(model=model, optimizer=model.optimizer, loss=model.loss)
    return [np.asarray(weight) for weight in model.get_weights()]


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad_sinks")
    plain_objects = {}
    plain = _fit([], plain_objects)
    _fit([kgrad.GradientProbe(str(folder / "alone"), every_n_steps=EVERY)])
    sinks = [Raising(), Sleeping(), Hanging()]
    users_objects = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weights = _fit(
            [kgrad.GradientProbe(str(folder / "with_sinks"), every_n_steps=EVERY, sinks=sinks)], users_objects
        )
    sinks[2].release.set()
    return {
        "plain": plain, "weights": weights, "sinks": sinks,
        "users_objects": users_objects, "plain_objects": plain_objects,
        "warnings": [str(warning.message) for warning in caught if warning.category is RuntimeWarning],
        "alone": kgrad.read_logs(str(folder / "alone"))["kgrad"],
        "with_sinks": kgrad.read_logs(str(folder / "with_sinks"))["kgrad"],
    }


def test_bad_sinks_leave_the_weights_as_plain_fit_leaves_them(fits):
    for plain, probed in zip(fits["plain"], fits["weights"]):
        np.testing.assert_array_equal(probed, plain)


def test_bad_sinks_leave_the_tensorboard_logs_complete(fits):
    alone, with_sinks = fits["alone"], fits["with_sinks"]
    assert len(alone["scalars"]["grad_norm/hidden"].steps) == RECORDS
    for kind in ("scalars", "histograms"):
        assert list(with_sinks[kind]) == list(alone[kind])
        for tag, series in alone[kind].items():
            np.testing.assert_array_equal(with_sinks[kind][tag].steps, series.steps)
            np.testing.assert_array_equal(with_sinks[kind][tag].values, series.values)


def test_each_bad_sink_warns_once_then_counts_what_it_lost(fits):
    raising, sleeping, hanging = fits["sinks"]
    assert (raising.delivered, raising.dropped) == (0, RECORDS)
    # Sleeping: what it wrote by the end was delivered, the rest counted as lost (a call still
    # sleeping then may finish later: it is counted as lost, not delivered).
    assert sleeping.delivered <= len(sleeping.steps) and sleeping.delivered + sleeping.dropped == RECORDS
    assert sleeping.dropped > 0
    # Hanging: nothing delivered while fit ran, every record counted as lost.
    assert (hanging.delivered, hanging.dropped) == (0, RECORDS)
    for sink in fits["sinks"]:
        name = f"kgrad.{type(sink).__name__}"
        first = [text for text in fits["warnings"] if text.startswith(f"{name}: ")]
        last = [text for text in fits["warnings"] if text.startswith(f"{name} lost ")]
        assert len(first) == 1 and "shown once" in first[0], fits["warnings"]
        assert len(last) == 1, fits["warnings"]
        assert last[0].startswith(f"{name} lost {sink.dropped} of {RECORDS} records this fit")
    assert "ConnectionError: the tracker is down" in " ".join(fits["warnings"])
    assert "queue of 3 calls was full" in " ".join(fits["warnings"])


def test_the_end_of_fit_lets_every_sink_go(fits):
    # The hanging sink's close_timeout=0: the end of fit gave up on it at once.
    assert [worker.users(sink) for sink in fits["sinks"]] == [0] * 3
    # Nothing of kgrad's is left on the user's sinks (it lives in kgrad.sinks.worker): they have
    # the attributes of a new sink of their class.
    assert [sorted(set(vars(sink)) - set(vars(type(sink)()))) for sink in fits["sinks"]] == [[]] * 3


def test_the_fit_adds_to_the_users_objects_only_the_models_one_registry(fits):
    # What kgrad keeps for a later fit is an entry of kgrad.backends.common.attached, in one
    # attribute of the model; the optimizer and the loss have the attributes a plain fit leaves.
    added = {name: sorted(set(vars(owner)) - set(vars(fits["plain_objects"][name])))
             for name, owner in fits["users_objects"].items()}
    assert added == {"model": [attached.ATTRIBUTE], "optimizer": [], "loss": []}
    model = fits["users_objects"]["model"]
    assert attached.names(model) and set(attached.names(model)) <= {"kept_step", "kept_train_functions"}
