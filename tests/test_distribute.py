"""GradientProbe under tf.distribute: the numbers of the global batch, as on one device.

Logical CPU devices must be configured before TensorFlow initialises its
devices, and each multi-worker worker is a process of its own, so the
distributed runs happen in subprocesses running ``scripts/distributed_fit.py``;
the single-device reference runs here, in the test process, with the same
model, weights and global batches.
"""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import kgrad
from scripts import distributed_fit, distributed_own_step

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "distributed_fit.py")
#: Seconds one distributed run may take (a few on an idle machine) before it is killed.
RUN_TIMEOUT = 240

#: One tag of each kind the probe reports; the comparisons must not be vacuous.
EXPECTED_SCALARS = (
    "activation_norm/hidden",
    "activation_std/out",
    "grad_norm/middle",
    "grad_zero_fraction/hidden",
    "pred_grad_norm/output",
    "pred_grad_example_norm_max/output",
    "input_grad_norm/input",
    "weight_grad_norm/hidden/kernel",
    "weight_grad_max/out/bias",
    "weight_norm/middle/kernel",
    "update_ratio/out/kernel",
    "global/grad_norm",
)
EXPECTED_HISTOGRAMS = (
    "activation_hist/hidden",
    "grad_hist/middle",
    "pred_grad_hist/output",
    "input_grad_hist/input",
    "weight_grad_hist/out/kernel",
)


def _run_script(arguments, timeout=RUN_TIMEOUT, env=None):
    """Runs the script; on timeout ``subprocess.run`` kills it before raising."""
    result = subprocess.run(
        [sys.executable, SCRIPT, *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _load(path):
    with np.load(path) as arrays:
        return {key: arrays[key] for key in arrays.files}


def _records(results):
    """``{(record index, tag): value}`` of the scalars, and of the histograms."""
    scalars, histograms = {}, {}
    for key, value in results.items():
        kind, _, rest = key.partition("/")
        index, _, tag = rest.partition("/")
        if kind == "scalar":
            scalars[int(index), tag] = float(value)
        elif kind == "histogram":
            histograms[int(index), tag] = value
    return scalars, histograms


def _weights(results):
    return [results[f"weight/{index}"] for index in range(sum(k.startswith("weight/") for k in results))]


def assert_same_probes(actual, expected, rtol, atol, exact_counts=True):
    """Every record of ``actual`` equals that of ``expected``, tag by tag."""
    assert actual["steps"].tolist() == expected["steps"].tolist()
    actual_scalars, actual_histograms = _records(actual)
    expected_scalars, expected_histograms = _records(expected)
    assert set(actual_scalars) == set(expected_scalars)
    assert set(actual_histograms) == set(expected_histograms)
    for key, value in expected_scalars.items():
        assert actual_scalars[key] == pytest.approx(value, rel=rtol, abs=atol), key
    for key, buckets in expected_histograms.items():
        got = actual_histograms[key]
        np.testing.assert_allclose(got[:, :2], buckets[:, :2], rtol=rtol, atol=atol, err_msg=str(key))
        if exact_counts:
            np.testing.assert_array_equal(got[:, 2], buckets[:, 2], err_msg=str(key))
        else:
            assert got[:, 2].sum() == buckets[:, 2].sum(), key


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    """The reference: the same training on the default (single-device) strategy."""
    directory = tmp_path_factory.mktemp("single")
    records, weights = distributed_fit.train(tf.distribute.get_strategy(), str(directory / "logs"))
    distributed_fit.save(directory / "result.npz", records, weights)
    results = _load(directory / "result.npz")
    scalars, histograms = _records(results)
    assert {tag for _, tag in scalars} >= set(EXPECTED_SCALARS)
    assert {tag for _, tag in histograms} >= set(EXPECTED_HISTOGRAMS)
    return results


@pytest.fixture(scope="module")
def one_device_guard_nan():
    """`distributed_fit.guard_nan`'s fields on one device (the mirrored and multi-worker references)."""
    return distributed_fit.guard_nan(tf.distribute.get_strategy())[0]


@pytest.fixture(scope="module")
def one_device_own_spike(tmp_path_factory):
    """`distributed_own_step.own_spike`'s fields on one device."""
    logs = tmp_path_factory.mktemp("own_spike") / "logs"
    return distributed_own_step.own_spike(tf.distribute.get_strategy(), str(logs))[0]


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    """One MirroredStrategy run over 2 logical CPU devices, in a subprocess."""
    directory = tmp_path_factory.mktemp("mirrored")
    output = _run_script(["mirrored", str(directory), str(directory / "logs")])
    assert "done: 2 replicas" in output.stdout
    return directory


def test_mirrored_probes_equal_single_device_on_the_global_batch(mirrored, single_device):
    assert_same_probes(_load(mirrored / "result.npz"), single_device, rtol=1e-5, atol=1e-6)


def test_mirrored_training_equals_single_device(mirrored, single_device):
    for got, expected in zip(_weights(_load(mirrored / "result.npz")), _weights(single_device)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_mirrored_event_files_hold_every_probed_step(mirrored, single_device):
    logs = kgrad.read_logs(mirrored / "logs")["kgrad"]
    scalars, histograms = _records(single_device)
    steps = single_device["steps"].tolist()
    assert set(logs["scalars"]) == {tag for _, tag in scalars}
    assert set(logs["histograms"]) == {tag for _, tag in histograms}
    for tag in EXPECTED_SCALARS:
        series = logs["scalars"][tag]
        assert series.steps.tolist() == steps
        expected = [scalars[index, tag] for index in range(len(steps))]
        np.testing.assert_allclose(series.values, expected, rtol=1e-5, atol=1e-6)


def test_mirrored_mixed_precision_equals_single_device(mirrored):
    expected_records, expected_weights = distributed_fit.train_mixed_precision(
        tf.distribute.get_strategy()
    )
    assert keras.mixed_precision.global_policy().name == "float32"
    path = mirrored / "single_mixed.npz"
    distributed_fit.save(path, expected_records, expected_weights)
    expected = _load(path)
    scalars, _ = _records(expected)
    assert {tag for _, tag in scalars} >= {"global/loss_scale", "global/loss_scale_skipped"}
    # float16 activations: a replica's half batch rounds a little differently,
    # and a value can move across a bucket edge.
    assert_same_probes(
        _load(mirrored / "mixed.npz"), expected, rtol=3e-2, atol=2e-3, exact_counts=False
    )


def test_gradient_probe_refuses_a_models_own_train_step_on_more_than_one_replica(mirrored):
    # The guard alone is supported there (`test_own_step_guard_*` below); a probe is not yet.
    message = (mirrored / "own_step_probe_error.txt").read_text()
    assert message.startswith("kgrad cannot probe model 'own_step' on 2 replicas: its class OwnStep defines")
    assert "(kgrad.NonFiniteGuard alone is supported)" in message and "Train it on one device" in message


def _guard_run(directory, name):
    """``(fields, states)`` of a mirrored guard run: ``states[batch][variable][replica]``."""
    return json.loads((directory / f"{name}.json").read_text()), _replica_states(directory / f"{name}.npz")


def _replica_states(path):
    """``states[batch][variable][replica]`` of `distributed_fit.save_states`."""
    copies = {}
    for key, value in _load(path).items():
        batch, variable, replica = map(int, key.split("/"))
        copies.setdefault(batch, {}).setdefault(variable, {})[replica] = value
    states = [[[variables[v][r] for r in sorted(variables[v])] for v in sorted(variables)]
              for _, variables in sorted(copies.items())]
    return states


def _assert_kept_on_every_replica(states, kept_step):
    """The step ``kept_step`` left every replica's weights and optimizer state bit for bit as before it."""
    for variables in states:  # the replicas' copies stay one
        for copies in variables:
            assert len(copies) == 2
            np.testing.assert_array_equal(copies[0], copies[1])
    for before, after in zip(states[kept_step - 1], states[kept_step]):
        for copy_before, copy_after in zip(before, after):
            np.testing.assert_array_equal(copy_after, copy_before)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(states[kept_step - 2], states[kept_step - 1]))


def test_non_finite_guard_trips_under_mirrored_as_on_one_device(mirrored, one_device_guard_nan):
    fields, states = _guard_run(mirrored, "guard_nan")
    _assert_trips_as_on_one_device(fields, one_device_guard_nan)
    _assert_kept_on_every_replica(states, distributed_fit.NAN_EXAMPLE // distributed_fit.GLOBAL_BATCH)
    # A GradientProbe beside the guard records the global batch's values, as on one device.
    one = one_device_guard_nan
    assert [step for step, _ in fields["records"]] == [step for step, _ in one["records"]] == [0, 2]
    for (_, scalars), (_, one_scalars) in zip(fields["records"], one["records"]):
        assert scalars.keys() == one_scalars.keys() and "global/grad_norm" in scalars
        for tag, value in one_scalars.items():
            assert scalars[tag] == pytest.approx(value, rel=1e-5, abs=1e-6), tag


def _assert_trips_as_on_one_device(fields, one):
    """`distributed_fit.guard_nan` of several replicas trips as ``one``, the run on one device."""
    trip = distributed_fit.NAN_EXAMPLE // distributed_fit.GLOBAL_BATCH
    assert fields["step"] == one["step"] == trip and fields["iterations"] == one["iterations"] == trip
    assert fields["tensor"] == one["tensor"] and fields["non_finite"] == one["non_finite"]
    assert fields["last_finite_step"] == one["last_finite_step"] == trip - 1
    assert fields["last_finite_norm"] == pytest.approx(one["last_finite_norm"], rel=1e-5)
    # The NaN sits in the second replica's half: one device's replay could not see it.
    assert fields["replay_note"].startswith("Not replayed: the model trains on 2 replicas")


def test_spike_skipping_under_mirrored_skips_as_on_one_device(mirrored, tmp_path):
    fields, states = _guard_run(mirrored, "guard_spike")
    one, _ = distributed_fit.guard_spike(tf.distribute.get_strategy(), str(tmp_path / "logs"))
    assert fields["steps"] == one["steps"] == [distributed_fit.SPIKE_BATCH] and not fields["stopped"]
    assert fields["iterations"] == one["iterations"] == 49  # 50 batches, one update skipped
    # Every value's z-score, the sampled ones' against samples of the global update (not a replica's).
    assert set(fields["z_scores"]) == {"grad_norm", "update_ratio", "cos_grad_weight", "adam_rms"}
    for kind in ("values", "z_scores"):
        assert fields[kind].keys() == one[kind].keys() and fields[kind]
        for name, per_weight in one[kind].items():
            assert fields[kind][name] == pytest.approx(per_weight, rel=1e-5), (kind, name)
    # Judged on the global batch's loss and gradient norm: one device's window, score and decisions.
    for tag in distributed_fit.SPIKE_TAGS:
        (steps, values), (one_steps, one_values) = fields["series"][tag], one["series"][tag]
        assert steps == one_steps, tag
        np.testing.assert_allclose(values, one_values, rtol=1e-5, atol=1e-5, err_msg=tag)
    _assert_kept_on_every_replica(states, distributed_fit.SPIKE_BATCH)
    # The host reads kgrad's variables after the skip and at the epoch's end only, as on one device.
    assert fields["reads"] == one["reads"] == sorted([str(distributed_fit.SPIKE_BATCH), "end"])


def _own_run(directory, name):
    """``(fields, {part: states})`` of a run of `distributed_own_step` under a strategy."""
    fields = json.loads((directory / f"{name}.json").read_text())
    return fields, {part: _replica_states(directory / f"{name}_{part}.npz") for part in ("first", "second")}


def _assert_applied_on_every_replica(states, step):
    """The step ``step`` changed the variables, the same way on every replica."""
    for variables in states:
        for copies in variables:
            np.testing.assert_array_equal(copies[0], copies[1])
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(states[step - 1], states[step]))


def test_own_step_guard_trips_under_mirrored_as_on_one_device(mirrored):
    fields, states = _own_run(mirrored, "own_nan")
    one, _ = distributed_own_step.own_nan(tf.distribute.get_strategy())
    trip = distributed_own_step.NAN_EXAMPLE // distributed_fit.GLOBAL_BATCH
    # The part that read the NaN trips, at one device's step, naming its tensor with one device's counts.
    assert fields["step"] == one["step"] == trip and fields["tensor"] == one["tensor"] == "loss/first/loss"
    assert fields["non_finite"] == one["non_finite"]
    assert fields["last_finite_step"] == one["last_finite_step"] == trip - 1
    assert fields["last_finite_norm"] == pytest.approx(one["last_finite_norm"], rel=1e-5)
    # Part `first` skipped its update; part `second` was finite and applied it (then fit stopped).
    assert fields["iterations"] == one["iterations"] == {"first": trip, "second": trip + 1}
    assert fields["replay_note"].startswith("Not replayed: the model trains on 2 replicas")
    _assert_kept_on_every_replica(states["first"], trip)
    _assert_applied_on_every_replica(states["second"], trip)


def test_own_step_spike_skipping_under_mirrored_skips_one_part_as_on_one_device(
    mirrored, one_device_own_spike
):
    fields, states = _own_run(mirrored, "own_spike")
    _assert_own_step_skips_as_on_one_device(fields, one_device_own_spike)
    _assert_kept_on_every_replica(states["first"], distributed_own_step.SPIKE_BATCH)
    _assert_applied_on_every_replica(states["second"], distributed_own_step.SPIKE_BATCH)


def _assert_own_step_skips_as_on_one_device(fields, one, series=True):
    """`distributed_own_step.own_spike` of several replicas skips as ``one``, the run on one device."""
    spike = distributed_own_step.SPIKE_BATCH
    assert fields["skipped"] == one["skipped"] == [[spike, "first"]] and not fields["stopped"]
    assert fields["iterations"] == one["iterations"] == {"first": 49, "second": 50}
    for kind in ("values", "z_scores"):
        assert fields[kind].keys() == one[kind].keys() and fields[kind]
        for name, per_weight in one[kind].items():
            assert fields[kind][name] == pytest.approx(per_weight, rel=1e-5), (kind, name)
    for got, expected in zip(fields["weights"], one["weights"], strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # The host reads kgrad's variables after the skip and at the epoch's end only, as on one device.
    assert fields["reads"] == one["reads"] == sorted([str(spike), "end"])
    assert fields["left_replaced"] == one["left_replaced"] == []  # the layers' and optimizers' own calls
    # Each part judged on its own global loss and gradient norm: one device's rows, part by part.
    if not series:  # a worker that is not the chief: it wrote no logs
        assert fields["series"] == {}
        return
    assert fields["series"].keys() == one["series"].keys() and len(one["series"]) == 2 * len(
        distributed_fit.SPIKE_TAGS)
    for tag, (one_steps, one_values) in one["series"].items():
        steps, values = fields["series"][tag]
        assert steps == one_steps, tag
        np.testing.assert_allclose(values, one_values, rtol=1e-5, atol=1e-5, err_msg=tag)


def test_replaced_calls_of_interleaved_replica_threads_call_each_threads_own_and_restore_the_layer():
    # MirroredStrategy traces each replica in a thread of its own, taking turns at each
    # merge_call: two replicas' ProbeTapes replace the same layer's call, and exit in any order.
    from kgrad.backends.common.calls import replaced_calls

    class Operation:
        def call(self, x):
            return x

    operation, seen = Operation(), []
    wrap = lambda tag: lambda call: lambda x: seen.append(tag) or call(x)  # noqa: E731
    entered, called, exited = threading.Event(), threading.Event(), threading.Event()

    def replica_0():
        with replaced_calls([(operation, wrap("A"))]):
            operation.call(1)
            entered.set()
            called.wait(timeout=30)
            operation.call(1)
        exited.set()  # its block closed while replica 1's is open

    def replica_1():
        entered.wait(timeout=30)
        with replaced_calls([(operation, wrap("B"))]):
            operation.call(1)
            called.set()
            exited.wait(timeout=30)
            operation.call(1)

    threads = [threading.Thread(target=replica) for replica in (replica_0, replica_1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert seen == ["A", "B", "A", "B"]
    assert "call" not in operation.__dict__ and operation.call(2) == 2 and seen == ["A", "B", "A", "B"]


def _probing_model():
    model = distributed_fit.build_model()
    return kgrad.ProbingModel(model.inputs, model.outputs), []


@pytest.mark.parametrize(
    "user, build",
    [
        ("kgrad.GradientProbe", lambda: (distributed_fit.build_model(), [kgrad.GradientProbe()])),
        ("kgrad.NonFiniteGuard", lambda: (distributed_fit.build_model(), [kgrad.NonFiniteGuard()])),
        ("kgrad", _probing_model),
    ],
    ids=["GradientProbe", "NonFiniteGuard", "ProbingModel"],
)
def test_untested_strategies_are_refused_before_training(user, build):
    strategy = tf.distribute.experimental.CentralStorageStrategy()
    with strategy.scope():
        model, callbacks = build()
        model.compile("sgd", "sparse_categorical_crossentropy", jit_compile=False)
    before = [np.copy(w) for w in model.get_weights()]
    x, y = distributed_fit.data()
    with pytest.raises(
        ValueError,
        match=rf"^{re.escape(user)} does not support CentralStorageStrategy yet\. Received: "
        r"model '.*' created under CentralStorageStrategy.*MirroredStrategy",
    ):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=callbacks)
    assert "train_step" not in model.__dict__
    assert int(model.optimizer.iterations.numpy()) == 0
    for got, expected in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, expected)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker_guard_runs(directory):
    """``(own_spike fields, guard_nan fields, {run or part: states})`` of a multi-worker worker."""
    own_spike, part_states = _own_run(directory, "own_spike")
    guard_nan, states = _guard_run(directory, "guard_nan")
    return own_spike, guard_nan, {"guard_nan": states, **part_states}


@pytest.mark.slow
def test_multi_worker_probes_and_guard_equal_single_process_and_only_the_chief_writes(
    tmp_path, single_device, one_device_guard_nan, one_device_own_spike
):
    cluster = {"worker": [f"127.0.0.1:{_free_port()}" for _ in range(2)]}
    log_dir = tmp_path / "logs"  # shared, as on a shared file system
    workers, outputs = [], []
    try:
        for index in range(2):
            out_dir = tmp_path / f"worker{index}"
            out_dir.mkdir()
            tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            outputs.append(open(out_dir / "output.txt", "w"))
            workers.append(
                subprocess.Popen(
                    [sys.executable, SCRIPT, "worker", str(out_dir), str(log_dir)],
                    stdout=outputs[-1],
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_CONFIG": json.dumps(tf_config)},
                )
            )
        deadline = time.monotonic() + RUN_TIMEOUT
        for index, worker in enumerate(workers):
            returncode = worker.wait(timeout=max(1.0, deadline - time.monotonic()))
            output = (tmp_path / f"worker{index}" / "output.txt").read_text()
            assert returncode == 0, output[-3000:]
            assert "done: 2 replicas" in output
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        for output in outputs:
            output.close()

    for index in range(2):
        results = _load(tmp_path / f"worker{index}" / "result.npz")
        assert_same_probes(results, single_device, rtol=1e-5, atol=1e-6)
        for got, expected in zip(_weights(results), _weights(single_device)):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # The guard on the global batch, decided across workers: a trip and an own step's skipped part.
    runs = [_worker_guard_runs(tmp_path / f"worker{index}") for index in range(2)]
    for index, (own_spike, guard_nan, _) in enumerate(runs):
        _assert_trips_as_on_one_device(guard_nan, one_device_guard_nan)
        _assert_own_step_skips_as_on_one_device(own_spike, one_device_own_spike, series=index == 0)
    # One replica per worker: the workers' copies, as the replicas' of MirroredStrategy.
    states = {name: [[list(copies) for copies in zip(*variables)] for variables in zip(runs[0][2][name],
                                                                                    runs[1][2][name])]
              for name in runs[0][2]}
    trip = distributed_fit.NAN_EXAMPLE // distributed_fit.GLOBAL_BATCH
    _assert_kept_on_every_replica(states["guard_nan"], trip)
    _assert_kept_on_every_replica(states["first"], distributed_own_step.SPIKE_BATCH)
    _assert_applied_on_every_replica(states["second"], distributed_own_step.SPIKE_BATCH)
    spike_logs = kgrad.read_logs(tmp_path / "own_spike_logs")
    for part in ("first", "second"):
        (event_file,) = os.listdir(tmp_path / "own_spike_logs" / "kgrad" / part)
        assert f".{workers[0].pid}." in event_file
    assert spike_logs["kgrad/first"]["scalars"]["global/step_skipped"].values.tolist() == [
        float(step == distributed_own_step.SPIKE_BATCH) for step in range(distributed_own_step.BATCHES)]
    # Only the chief (worker 0) wrote; its event files carry its process id.
    event_files = sorted(os.listdir(log_dir / "kgrad"))
    assert len(event_files) == 1, event_files
    assert f".{workers[0].pid}." in event_files[0]
    logs = kgrad.read_logs(log_dir)["kgrad"]
    assert logs["scalars"]["global/grad_norm"].steps.tolist() == single_device["steps"].tolist()
