"""The sinks' contract: bad input named before fit, a missing tracker named with its extra, the worker's
queue (order, bound, counts), one opening for a sink shared by the probe and the guard, W&B runs started
and finished when asked, NaN in JSON Lines."""

import json
import sys
import threading

import keras
import numpy as np
import pytest
from tracker_readers import wandb_run, wandb_series

import kgrad
from kgrad.sinks.base import counts_and_edges
from kgrad.sinks.worker import SinkWorker


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    model.compile("sgd", "mse")
    return model


def _fit(model, callbacks, steps=4):
    x = np.ones((steps * 2, 2), "float32")
    model.fit(x, np.ones((len(x), 1)), batch_size=2, verbose=0, callbacks=callbacks)


@pytest.mark.parametrize(
    "sinks, match",
    [
        ("wandb", r"Received: sinks='wandb' \(a str\)"),
        ([kgrad.Sink(), print], r"\(item 1 is a builtin_function_or_method\)"),
        (3, r"Received: sinks=3 \(a int\)"),
    ],
)
def test_sinks_that_are_not_sinks_are_refused_when_the_callback_is_made(sinks, match):
    for callback in (kgrad.GradientProbe, kgrad.NonFiniteGuard):
        with pytest.raises(TypeError, match=r"`sinks` must be a list of kgrad sinks .*" + match):
            callback(sinks=sinks)


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({"queue_size": 0}, r"`queue_size` must be a positive int. Received: queue_size=0"),
        ({"queue_size": True}, r"Received: queue_size=True"),
        ({"close_timeout": -1}, r"`close_timeout` must be a number of seconds >= 0. Received: "
                                r"close_timeout=-1"),
    ],
)
def test_bad_queue_settings_are_refused(arguments, match):
    with pytest.raises(ValueError, match=match):
        kgrad.JsonLinesSink("x.jsonl", **arguments)


@pytest.mark.parametrize("sink, module, extra",
                         [("WandbSink", "wandb", "wandb"), ("MlflowSink", "mlflow", "mlflow")])
def test_a_missing_tracker_is_named_with_its_extra_when_the_sink_is_made(monkeypatch, sink, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import wandb` raises ImportError
    with pytest.raises(ImportError, match=rf"kgrad.{sink} needs the `{module}` package.*"
                                          rf'pip install "kgrad\[{extra}\]"'):
        getattr(kgrad, sink)()


def test_no_active_run_stops_fit_before_its_first_step_and_leaves_the_model_alone(tmp_path):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    for sink, match in ((kgrad.WandbSink(), r"found no active W&B run.*WandbSink\(init="),
                        (kgrad.MlflowSink(), r"found no active MLflow run.*mlflow.start_run\(\)")):
        model = _model()
        with pytest.raises(ValueError, match=match):
            _fit(model, [kgrad.GradientProbe(str(tmp_path / "logs"), sinks=[sink])])
        assert not (tmp_path / "logs").exists()
        assert "train_step" not in vars(model)  # no probing step left installed


def test_a_wandb_run_started_by_the_sink_is_finished_at_the_end_of_fit(tmp_path):
    wandb = pytest.importorskip("wandb")
    assert wandb.run is None
    init = {"mode": "offline", "dir": str(tmp_path), "project": "kgrad-test"}
    sink = kgrad.WandbSink(init=init, report=False)
    _fit(_model(), [kgrad.GradientProbe(every_n_steps=2, sinks=[sink])])
    assert wandb.run is None and (sink.delivered, sink.dropped) == (2, 0)
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    history, _, _ = wandb_run(str(run_dir))
    assert sorted(wandb_series(history, "kgrad/grad_norm/out")) == [0, 2]


class _Recording(kgrad.Sink):
    def __init__(self, **arguments):
        super().__init__(**arguments)
        self.calls = []

    def open(self):
        self.calls.append("open")

    def write_record(self, record):
        self.calls.append(("record", record.step))

    def write_guard_report(self, step, fields):
        self.calls.append(("guard_report", step, fields["tensor"]))

    def flush(self):
        self.calls.append("flush")

    def close(self):
        self.calls.append("close")


def test_a_sink_shared_by_the_probe_and_the_guard_is_opened_and_closed_once_and_calls_keep_their_order():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="hidden"),
                              keras.layers.Lambda(lambda t: keras.ops.log(t), name="log"),
                              keras.layers.Dense(1, name="out")])
    model.compile("sgd", "mse")
    sink = _Recording()
    x = np.full((8, 2), -1.0, "float32")
    x[:4] = 1.0  # log of a negative number from step 2 on
    keras.utils.set_random_seed(0)
    model.set_weights([np.eye(2, dtype="float32"), np.zeros(2, "float32"), np.ones((2, 1), "float32"),
                       np.zeros(1, "float32")])
    with pytest.warns(RuntimeWarning, match="kgrad.NonFiniteGuard: Non-finite values at step 2"):
        model.fit(x, np.ones((8, 1)), batch_size=2, shuffle=False, verbose=0, callbacks=[
            kgrad.GradientProbe(every_n_steps=1, sinks=[sink]),
            kgrad.NonFiniteGuard(action="warn", sinks=[sink], replay=False)])
    records = [call for call in sink.calls if call[0] == "record"]
    trips = [call for call in sink.calls if call[0] == "guard_report"]
    assert sink.calls[0] == "open" and sink.calls[-1] == "close" and sink.calls.count("open") == 1
    # A skipped update leaves optimizer.iterations, the step, where it was.
    assert records == [("record", 0), ("record", 1), ("record", 2), ("record", 2)]
    assert [step for _, step, _ in trips] == [2, 2]
    assert (sink.delivered, sink.dropped) == (6, 0)


def test_a_full_queue_drops_the_newest_calls_and_counts_them():
    gate = threading.Event()

    class Gated(_Recording):
        def write_record(self, record):
            gate.wait(30)
            super().write_record(record)

    sink = Gated(queue_size=2)
    worker = SinkWorker(sink)
    with pytest.warns(RuntimeWarning, match=r"Gated: its queue of 2 calls was full") as caught:
        offered = [worker.offer("write_record", kgrad.ProbeRecord(step, {}, {})) for step in range(5)]
        worker.offer("flush", counted=False)
    assert len(caught) == 1  # once
    # One call may already be in the worker's hands; the queue holds 2 more.
    assert offered[:2] == [True, True] and offered.count(True) in (2, 3)
    gate.set()
    with pytest.warns(RuntimeWarning, match=rf"kgrad.Gated lost {5 - offered.count(True)} of 5 records"):
        worker.close(timeout=30)
    delivered = [call[1] for call in sink.calls if call[0] == "record"]
    assert delivered == list(range(offered.count(True))) and sink.delivered == len(delivered)


def test_histogram_buckets_with_a_gap_are_refused_not_papered_over():
    with pytest.raises(ValueError, match="not contiguous"):
        counts_and_edges([[0.0, 1.0, 2.0], [1.5, 3.0, 5.0]])


def test_json_lines_write_nan_and_inf_that_pandas_reads_back(tmp_path):
    pandas = pytest.importorskip("pandas")
    sink = kgrad.JsonLinesSink(str(tmp_path / "out.jsonl"))
    sink.open()
    sink.write_record(kgrad.ProbeRecord(3, {"a": float("nan"), "b": float("inf"), "c": 0.5},
                                        {"h": np.array([[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]], np.float32)}))
    sink.close()
    line = json.loads((tmp_path / "out.jsonl").read_text())
    assert line["histograms"] == {"h": {"edges": [0.0, 1.0, 2.0], "counts": [2, 3]}}
    frame = pandas.read_json(tmp_path / "out.jsonl", lines=True)
    assert np.isnan(frame["a"][0]) and frame["b"][0] == np.inf and frame["c"][0] == 0.5
    assert frame["step"][0] == 3 and frame["record"][0] == "probe"


def test_histograms_of_tensors_without_a_finite_element_keep_their_nan_edges():
    counts, edges = counts_and_edges([[np.nan, np.nan, 0.0], [np.nan, np.nan, 0.0]])
    assert counts.tolist() == [0, 0] and np.isnan(edges).all() and edges.shape == (3,)


def test_a_probe_tape_s_records_carry_its_name_to_the_sinks(tmp_path):
    if keras.config.backend() != "tensorflow":
        pytest.skip("kgrad.ProbeTape is TensorFlow's; on JAX a model's own step uses kgrad.value_and_grad")
    import tensorflow as tf

    class OwnStep(keras.Model):
        def train_step(self, data):
            x, y = data
            with kgrad.ProbeTape(self, name="critic") as tape:
                loss = keras.ops.mean(keras.ops.square(self(x) - y))
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_weights),
                                               self.trainable_weights))
            return {"loss": loss}

    keras.utils.set_random_seed(0)
    inputs = keras.Input((2,))
    model = OwnStep(inputs, keras.layers.Dense(1, name="out")(inputs))
    model.compile("sgd")
    jsonl, log_dir = str(tmp_path / "kgrad.jsonl"), str(tmp_path / "logs")
    probe = kgrad.GradientProbe(log_dir, every_n_steps=2, sinks=[kgrad.JsonLinesSink(jsonl)])
    model.fit(tf.ones((8, 2)), tf.ones((8, 1)), batch_size=2, verbose=0, callbacks=[probe])
    lines = [json.loads(line) for line in open(jsonl, encoding="utf-8")]
    written = kgrad.read_logs(log_dir)["critic/kgrad"]["scalars"]["grad_norm/out"]
    assert [(line["tape"], line["step"]) for line in lines] == [("critic", 0), ("critic", 2)]
    np.testing.assert_array_equal(np.float32([line["grad_norm/out"] for line in lines]),
                                  np.float32(written.values))
