"""Smoke test of the benchmark harness: it runs and writes what it promises.

Timing is not tested here (see shared/BENCHMARKING.md): only that the
smallest run completes and its outputs have the documented format.
"""

import doctest
import json
import pathlib
import subprocess
import sys

import pytest

import kgrad
from benchmarks import configs, run, timing


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bench")
    argv = [
        "--quick",
        "--models",
        "mlp",
        "--configs",
        "baseline_aa,probe_n100",
        "--pairs",
        "1",
        "--steps-per-epoch",
        "5",
        "--no-memory",
        "--out-dir",
        str(out_dir),
    ]
    code = run.main(argv)
    return code, out_dir


def test_tiny_run_writes_results_json(tiny_run):
    code, out_dir = tiny_run
    assert code == 0
    results = json.loads((out_dir / "results.json").read_text())
    assert results["mode"] == "quick"
    assert results["command"].startswith("python -m benchmarks.run --quick")
    assert {"cpu_model", "logical_cpus", "tensorflow", "keras"} <= set(results["machine"])
    model = results["models"]["mlp"]
    assert set(model["configs"]) == {"baseline", "baseline_aa", "probe_n100"}
    for name in ("baseline_aa", "probe_n100"):
        result = model["configs"][name]
        assert result["status"] == "ok"
        assert len(result["pairs"]) == 1
        assert result["cpu_ratio"]["median"] > 0 and result["wall_ratio"]["median"] > 0
        cpu = result["cpu_ratio"]
        assert cpu["median_low"] <= cpu["median"] <= cpu["median_high"]
    rows = {(row["config"], row["target"]): row for row in results["targets"]}
    assert rows[("probe_n100", "CPU time ratio")]["verdict"] in ("pass", "FAIL")
    low, high = rows[("probe_n100", "CPU time ratio")]["interval"]
    assert low <= rows[("probe_n100", "CPU time ratio")]["value"] <= high
    assert ("probe_n100", "peak memory ratio") not in rows  # --no-memory: no memory verdicts


def test_tiny_run_writes_results_markdown(tiny_run):
    _, out_dir = tiny_run
    text = (out_dir / "RESULTS.md").read_text()
    for heading in (
        "## Targets (issue 7)",
        "## Noise floor",
        "## Results per model",
        "## Overhead vs every_n_steps",
        "## Method",
        "## Machine",
    ):
        assert heading in text
    assert "`python -m benchmarks.run --quick --models mlp" in text
    assert "| `probe_n100` |" in text
    assert "| model | target | config | limit | measured | median's 95% interval | verdict |" in text


def test_samples_of_steps_end_mid_epoch_and_are_reported(tmp_path):
    argv = [
        "--quick", "--models", "mlp", "--configs", "baseline_aa,probe_n10", "--pairs", "2",
        "--steps-per-epoch", "30", "--sample-steps", "20", "--no-memory", "--out-dir", str(tmp_path),
    ]
    assert run.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    model = results["models"]["mlp"]
    assert model["sample_steps"] == 20 and results["settings"]["sample_steps"] == 20
    for name in ("baseline_aa", "probe_n10"):
        pairs = model["configs"][name]["pairs"]
        assert len(pairs) == 2 and all(p["cpu"] > 0 and p["baseline_cpu"] > 0 for p in pairs)
    # Per step from samples of 20 steps, not from epochs of 30.
    base = model["configs"]["baseline"]
    per_step = 1000 * timing.ratio_summary([s["cpu"] for s in base["samples"]])["median"] / 20
    assert base["cpu_ms_per_step"] == pytest.approx(per_step)
    text = (tmp_path / "RESULTS.md").read_text()
    assert "Samples of 20 steps (ending mid-epoch; epochs of 30 steps)" in text
    assert "A sample is 20 steps (`--sample-steps`)" in text


def test_sample_steps_that_would_probe_unevenly_are_refused():
    expected = r"multiple of .* every_n_steps \(1, 10\).*Received: 15.*--sample-steps 10"
    with pytest.raises(SystemExit, match=expected):
        run.main(["--quick", "--models", "mlp", "--configs", "probe_n10", "--sample-steps", "15"])


def test_config_budget_zero_times_every_pair():
    assert run.settings_from(run.parse_args(["--config-budget", "0"])).config_budget is None
    assert run.settings_from(run.parse_args(["--config-budget", "12"])).config_budget == 12.0
    assert run.settings_from(run.parse_args([])).config_budget == 30.0


def test_pure_helpers_doctests():
    for module in (timing, configs):
        failures, _ = doctest.testmod(module)
        assert failures == 0


def test_every_config_alternates_sides_of_its_baseline():
    names = ["a", "b", "c"]
    sides = {name: [] for name in names}
    for round_index in range(4):
        for before, after in timing.round_triplets(names, round_index):
            if before:
                sides[before].append("config_first")
            if after:
                sides[after].append("baseline_first")
    for name in names:
        assert (
            sides[name] == ["config_first", "baseline_first"] * 2
            or sides[name] == ["baseline_first", "config_first"] * 2
        )


def test_pair_budget_cuts_only_ratios_far_from_their_target():
    from benchmarks import bench
    from benchmarks.models import MODELS

    chosen = configs.select_configs(["baseline_aa", "probe_n1", "probe_n100", "extra_pass_n1"])
    model_bench = bench.ModelBench(MODELS["mlp"], chosen, run.PRESETS["full"], log_root=None)
    calibration = {"baseline": 5.0, "baseline_aa": 5.0, "probe_n1": 11.0, "probe_n100": 5.2,
                   "extra_pass_n1": 45.0}
    for name, result in model_bench.results.items():
        result.update(status="ok", calibration_epoch_cpu=calibration[name])
    model_bench._plan_pairs()
    planned = {name: model_bench.results[name]["pairs_planned"] for name in calibration if name != "baseline"}
    # A 30 CPU-s budget affords 3 pairs of 10 CPU-s: the minimum of 5 where the
    # ratio is far from its target (or has none), all 11 near it and for A/A.
    assert planned == {"baseline_aa": 11, "probe_n1": 5, "probe_n100": 11, "extra_pass_n1": 5}


def test_default_and_all_statistics_are_compared_at_every_period():
    by_name = {config.name: config for config in configs.all_configs()}
    for n in (1, 10, 100):
        default, every = by_name[f"probe_n{n}"], by_name[f"probe_all_n{n}"]
        assert (default.every_n_steps, every.every_n_steps) == (n, n)
        assert (default.baseline, every.baseline) == (configs.BASELINE, configs.BASELINE)
        assert every.time_target is None and not every.quick and "statistics='all'" in every.label
        (probe,) = every.make_callbacks(None, None, None)
        assert (probe.config.statistics, probe.config.every_n_steps) == ("all", n)
        (probe,) = default.make_callbacks(None, None, None)
        assert probe.config.statistics == "default"
    assert configs.peer_of("probe_all_n10") is None
    names = {config.name for config in configs.select_configs(["probe_all_n1"])}
    assert names == {"baseline", "probe_all_n1"}
    assert "probe_all_n1" not in {config.name for config in configs.select_configs(quick=True)}


def test_unknown_config_names_the_choices():
    with pytest.raises(ValueError, match=r"Unknown configuration\(s\) \['nope'\].*probe_n1"):
        configs.select_configs(["nope"])


@pytest.mark.slow
def test_memory_process_prints_peak_rss(tmp_path):
    command = [
        sys.executable,
        "-m",
        "benchmarks.memory",
        "--model",
        "mlp",
        "--config",
        "baseline",
        "--steps-per-epoch",
        "2",
        "--epochs",
        "1",
        "--max-cpu",
        "30",
        "--seed",
        "0",
        "--log-dir",
        str(tmp_path),
    ]
    root = pathlib.Path(run.__file__).resolve().parents[1]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300, check=True)
    line = [line for line in done.stdout.splitlines() if line.startswith("{")][-1]
    report = json.loads(line)
    assert report["maxrss_mb"] > 0 and report["steps"] == 2
    # Where the peak was reached: the first step's own figures are part of it.
    assert 0 < report["first_step_end_rss_mb"] <= report["first_step_peak_mb"] <= report["maxrss_mb"]
    assert 0 < report["end_rss_mb"] <= report["maxrss_mb"]


def test_guard_floor_measures_every_variant_against_plain():
    from benchmarks import guard_floor

    result = guard_floor.measure("mlp", rounds=2, steps=1)
    assert set(result.ratios) == set(result.intervals) == set(guard_floor.VARIANTS)
    assert result.ratios["plain"] == 1.0 and result.intervals["plain"] == (1.0, 1.0)
    assert result.plain_ms > 0
    for variant, (low, high) in result.intervals.items():
        assert 0 < low <= result.ratios[variant] <= high


def test_profile_ops_counts_op_events_only(tmp_path):
    from benchmarks import profile_ops
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    names = {
        1: "StatefulPartitionedCall/dense/MatMul:MatMul",  # an op of the train function
        2: "cond/then/_0/L2Loss_tfg_inlined_cond_0:L2Loss",  # an op of a called function
        3: "ExecutorState::Process",  # the executor's
        4: "Iterator::Root::ForeverRepeat",  # tf.data's
        5: "EagerLocalExecute: Shape",  # eager dispatch
    }
    for key, name in names.items():
        plane.event_metadata[key].id, plane.event_metadata[key].name = key, name
    line = plane.lines.add()
    for key, microseconds in [(1, 5), (1, 7), (2, 3), (3, 100), (4, 50), (5, 9)]:
        line.events.add(metadata_id=key, duration_ps=microseconds * 10**6)
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(space.SerializeToString())

    total, count = profile_ops.op_times(str(path))
    assert dict(total) == {"MatMul": 12.0, "L2Loss": 3.0}
    assert dict(count) == {"MatMul": 2, "L2Loss": 1}


def test_profile_ops_shows_what_a_probe_adds(capsys):
    from benchmarks import profile_ops

    profile_ops.main(["--model", "mlp", "--configs", "probe_n1", "--steps", "2", "--top", "40"])
    table = capsys.readouterr().out
    assert "**`probe_n1`**" in table
    # kgrad's own kernels appear as added op time, absent from the baseline: the one count
    # of every default log-magnitude histogram (DenseBincount; linear ones would be
    # HistogramFixedWidth), their keys' table lookups (GatherNd), and the concatenation
    # of the captured tensors into one matrix and of the weight snapshot.
    assert "| `DenseBincount` | 0 |" in table and "| `ConcatV2` | 0 |" in table
    assert "| `GatherNd` | 0 |" in table
    assert "`Bucketize`" not in table


def test_kernels_bucket_counts_agree_and_every_kernel_is_timed():
    import tensorflow as tf

    from benchmarks import kernels

    # Values at bucket centres: no rounding can move one across an edge.
    values = tf.constant([0.5, 1.5, 1.5, 2.5, 29.5, 29.5, 29.5], tf.float32)
    low, high = tf.constant(0.0), tf.constant(30.0)
    expected = [1, 2, 1] + [0] * 26 + [3]
    for name, _, kernel in kernels.KERNELS[: kernels.HISTOGRAM_KERNELS]:
        assert kernel(values, low, high).numpy().tolist() == expected, name
    # The top of the range is counted in the last bucket, as TensorBoard's histograms do.
    top = kernels.KERNELS[1][2](tf.constant([0.0, 30.0]), low, high).numpy()
    assert top[0] == 1 and top[-1] == 1

    result = kernels.measure([64], repeats=1, calls_per_turn=1)
    assert set(result) == {name for name, _, _ in kernels.KERNELS}
    assert all(set(per_size) == {64} for per_size in result.values())
    table = kernels.table(result, [64])
    assert "| `HistogramFixedWidth` | the histogram (kgrad, outside XLA) |" in table
    assert len(table.splitlines()) == 2 + len(kernels.KERNELS)


def test_kernels_rejects_bad_sizes(capsys):
    from benchmarks import kernels

    with pytest.raises(SystemExit):
        kernels.main(["--sizes", "0,12"])
    assert "received '0,12'" in capsys.readouterr().err


def test_probe_floor_replaces_the_statistics_in_floor_threads_only():
    import threading

    import numpy as np
    import tensorflow as tf

    from benchmarks import probe_floor
    from kgrad.backends.tensorflow.summarize import stats

    tensors = [tf.constant([1.0, 5.0, 2.0]), tf.constant([[3.0, -1.0]])]
    results = {}

    def summarize():
        moments, histograms = probe_floor._summarize_many(tensors, 4)
        results[threading.current_thread().name] = (moments.numpy(), histograms.numpy())

    names = ("bench-floor_one_pass_norms", "bench-floor_capture", "bench-probe_n1")
    for name in names:
        thread = threading.Thread(target=summarize, name=name)
        thread.start()
        thread.join()
    one_pass, capture, kgrad_own = (results[name] for name in names)
    # The max (every element read) or the first element, and no non-finite count.
    assert one_pass[0].tolist() == [[5.0] * 6 + [0.0], [3.0] * 6 + [0.0]]
    assert capture[0].tolist() == [[1.0] * 6 + [0.0], [3.0] * 6 + [0.0]]
    assert not one_pass[1].any() and one_pass[1].shape == (2, 4, 3)
    expected = stats.summarize_many(tensors, 4)
    np.testing.assert_array_equal(kgrad_own[0], expected[0].numpy())
    np.testing.assert_array_equal(kgrad_own[1], expected[1].numpy())


def test_probe_floor_times_every_floor_against_plain_fit():
    import dataclasses

    from benchmarks import probe_floor
    from kgrad.backends.tensorflow.summarize import stats

    settings = dataclasses.replace(run.PRESETS["quick"], pairs=1, min_pairs=1, steps_per_epoch=3)
    results = probe_floor.measure(["mlp"], settings)["mlp"]
    assert stats.summarize_many is probe_floor._REAL_SUMMARIZE_MANY  # restored
    timed = [config.name for config in probe_floor.floor_configs()][1:]
    assert {"floor_one_pass", "floor_capture_norms", "probe_n1"} <= set(timed)
    for name in timed:
        assert results[name]["status"] == "ok", results[name]["note"]
        assert results[name]["cpu_ratio"]["n"] == 1
    assert "| `floor_one_pass` | 1 |" in probe_floor.table("mlp", results)


def test_step_cost_times_each_kind_of_step(capsys):
    import numpy as np

    from benchmarks import step_cost

    result = step_cost.measure("mlp", every_n_steps=3, rounds=2, steps=6)
    # Steps 0 and 3 of each fit are probed, the others run Keras' own function.
    assert (len(result["probed"]), len(result["plain"]), len(result["baseline"])) == (4, 8, 12)
    assert len(result["round_ratios"]) == len(result["fit_ratios"]) == 2
    assert all(np.all(result[name] > 0) for name in ("plain", "probed", "baseline"))
    expected = step_cost.estimate(result["plain"], result["probed"], result["baseline"], 3)
    assert result["ratio"] == expected
    assert "estimated ratio to plain fit" in step_cost.describe("mlp", 3, result)
    with pytest.raises(SystemExit):
        step_cost.main(["--every", "4", "--steps", "6"])
    assert "`steps` must be a multiple of `every_n_steps`" in capsys.readouterr().err


def test_step_cost_estimate_weighs_one_probed_step_in_n():
    from benchmarks import step_cost

    assert step_cost.estimate([2.0], [6.0], [2.0], every_n_steps=1) == 3.0
    assert step_cost.estimate([2.0] * 3, [6.0], [2.0] * 5, every_n_steps=4) == 1.5
    failures, _ = doctest.testmod(step_cost)
    assert failures == 0


@pytest.mark.parametrize("variant", ["sums_branch", "sums_branch_unlowered", "sums_snapshot"])
def test_guard_floor_variants_skip_a_bad_update_and_apply_a_clean_one(variant):
    """Each hand-written guard of the floor is a real guard: what it costs is what guarding costs."""
    import keras
    import numpy as np
    import tensorflow as tf

    from benchmarks import guard_floor
    from benchmarks.models import MODELS, make_data

    spec = MODELS["mlp"]
    x, y = make_data(spec, 1, seed=0)
    keras.utils.set_random_seed(0)
    model = spec.build()
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=len(x), verbose=0)  # builds the optimizer, as guard_floor does
    flag = tf.Variable(False)
    object.__setattr__(model, "train_step", guard_floor._checked_step(model, flag, variant))
    model.make_train_function(force=True)

    def run(batch_x):
        model.train_function(iter(tf.data.Dataset.from_tensors((batch_x, y)).repeat()))

    run(x)
    state = [*model.weights, *model.optimizer.variables]
    before = [v.numpy().copy() for v in state]
    bad = x.copy()
    bad[3, 5] = np.nan
    run(bad)
    assert bool(flag.numpy())
    for value, variable in zip(before, state):
        np.testing.assert_array_equal(variable.numpy(), value)
    run(x)
    assert not bool(flag.numpy())
    assert int(model.optimizer.iterations.numpy()) == 3
    assert not np.array_equal(model.weights[0].numpy(), before[0])


def test_the_guard_under_xla_is_compared_with_plain_fit_under_xla():
    by_name = {config.name: config for config in configs.all_configs()}
    guard, guard_xla = by_name["guard"], by_name["guard_xla"]
    assert (guard.baseline, guard_xla.baseline) == (configs.BASELINE, configs.BASELINE_XLA)
    assert guard_xla.jit_compile and guard_xla.time_target == guard.time_target == 1.05
    assert not guard_xla.quick
    names = {config.name for config in configs.select_configs(["guard_xla"])}
    assert names == {"baseline", "baseline_xla", "guard_xla"}
    (callback,) = guard_xla.make_callbacks(None, None, None)
    assert isinstance(callback, kgrad.NonFiniteGuard)


def test_the_tracker_benchmark_times_the_wandb_sink_against_tensorboard_alone(capsys):
    pytest.importorskip("wandb")
    from benchmarks import trackers

    trackers.main(["--every", "2", "--pairs", "2", "--sample-steps", "4"])
    out = capsys.readouterr().out
    results = json.loads(out[: out.rindex("}") + 1])
    for name in ("wandb", "tensorboard_aa"):
        assert results[name]["cpu"]["n"] == results[name]["wall"]["n"] == 2
    # Warm-up epochs of 20 steps, then 2 turns of 4: a record every 2 steps, each made by the sink.
    assert results["sink_calls"] == (20 + 2 * 4) // 2 and results["sink_call_cpu_ms"] > 0
    assert "wandb / tensorboard: CPU" in out and "of the reference at every_n_steps=2" in out
    with pytest.raises(SystemExit):
        trackers.main(["--every", "4", "--sample-steps", "6"])
    assert "--sample-steps must be a multiple of --every" in capsys.readouterr().err
