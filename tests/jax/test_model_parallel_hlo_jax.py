"""Under `keras.distribution.ModelParallel` on 8 CPU devices, kgrad's probed and guarded steps move no tensor
between devices that Keras' own step does not: every statistic is local partial results and an all-reduce
of them (issue 52).

The model's `LayoutMap` splits kernels on both axes of a ``(2, 4)`` mesh, the
embedding and the vocabulary head on ``model``, the attention heads on
``model`` (tests/scripts/model_parallel_hlo_jax.py, run in its own process:
the number of host devices is fixed when JAX starts). The probe writes
``statistics="all"``, histograms and the optimizer, logits and attention
instruments. Each step is compiled again and its HLO read: an all-gather,
all-to-all or collective-permute, or a transfer to one device, of more than
a few KB is a tensor moved, not a statistic.
"""

import collections

import pytest
from device_scripts import run_script

#: Bytes per device above which a collective moves a tensor (the largest statistic, a histogram, is 780).
LARGE = 4096


@pytest.fixture(scope="module")
def steps():
    # ~1 min on a loaded machine. The script lets XLA's warnings through (TF_CPP_MIN_LOG_LEVEL=1).
    measured, stderr = run_script("model_parallel_hlo_jax.py", TF_CPP_MIN_LOG_LEVEL="1")
    warned = [line for line in stderr.splitlines() if "Involuntary full rematerialization" in line]
    measured["warnings"] = warned
    return measured


def only(step_kind):
    """The one step of a kind that ran (Keras' own train_step, the probed step, the guard's plain step)."""
    assert len(step_kind) == 1, sorted(step_kind)
    return next(iter(step_kind.values()))


def large_moves(step):
    return collections.Counter((op, size) for op, size, _, _ in step["moves"] if size > LARGE)


def test_the_kernels_are_split_on_both_axes(steps):
    assert steps["devices"] == 8
    shardings = steps["shardings"]
    assert shardings["up/kernel"] == "P('batch', 'model')"
    assert shardings["down/kernel"] == "P('model', 'batch')"
    assert shardings["embedding/embeddings"] == "P(None, 'model')"
    assert shardings["attention/query/kernel"] == "P(None, 'model', None)"


def programs(steps, kind):
    """The programs of a kind: one, or the skipping guard's two (its sample step's, then its plain step's)."""
    if kind == "skipping":
        assert len(steps[kind]) == 2, sorted(steps[kind])
        return list(steps[kind].values())
    return [only(steps[kind])]


@pytest.mark.parametrize("kind", ["probed", "guarded", "skipping"])
def test_no_tensor_is_moved_beyond_what_keras_step_moves(steps, kind):
    # "skipping": the guard with skip_spikes, its skip's and its sample's measures of the update.
    keras_moves = large_moves(only(steps["keras"]))
    # The test can fail: Keras' step itself gathers the kernels its matmuls need.
    assert keras_moves, "Keras' own step moves nothing: the layout no longer tests anything"
    for program in programs(steps, kind):
        extra = large_moves(program) - keras_moves
        details = [(op, size, result, where) for op, size, result, where in program["moves"]
                   if (op, size) in extra]
        assert not extra, f"{kind} step moves tensors that Keras' step does not: {details}"


def test_no_tensor_is_sent_to_one_device(steps):
    for kind in ("keras", "probed", "guarded", "skipping"):
        for step in programs(steps, kind):
            assert not [m for m in step["moves"] if m[0] == "maximal" and m[1] > LARGE], kind
            # Before partitioning, a host callback's operands are placed on one device (then gathered there).
            assert not step["maximal"], (kind, step["maximal"][:3])


def test_xla_replicates_no_tensor_involuntarily(steps):
    assert not steps["warnings"], steps["warnings"][:3]


def per_device_bytes(step):
    """What one device holds while the step runs: temporaries, arguments and outputs (less the donated)."""
    memory = step["memory"]
    return memory["temp"] + memory["argument"] + memory["output"] - memory["alias"]


# Measured on this model (bytes per device, temp + arguments + outputs - donated): Keras' step
# 373,668; the probed step 500,084 (was 788,668, then 553,196, then 499,444; its records 29,496 of
# it); the guarded step 370,798; spike skipping's plain step 393,010, its sample step 416,306 (was
# 486,514, 2026-12-07).
# Issue 52 asks for these bounds; the probed step's does not hold yet (docs/sharded.md, "What it costs").
@pytest.mark.xfail(strict=True, reason="issue 52: on this small model the probed step (statistics='all' "
                   "of every layer, 3 instruments) holds 1.34x Keras' step's memory: 97 KB of temporaries "
                   "for the layers' statistics in the backward pass, a fixed scratch that does not grow "
                   "with the weights (1.002x on the model 8x as wide; tests/jax/test_step_memory_jax.py "
                   "checks the bound on large split and data-parallel models; docs/sharded.md)")
def test_the_probed_step_holds_at_most_keras_step_and_its_statistics(steps):
    keras_step, probed = only(steps["keras"]), only(steps["probed"])
    # The statistics: what the probed step returns beyond the state (its records).
    statistics = probed["memory"]["output"] - keras_step["memory"]["output"]
    assert 0 < statistics < 64 * 1024
    assert per_device_bytes(probed) <= 1.05 * per_device_bytes(keras_step) + statistics


def test_the_guarded_step_holds_at_most_keras_step_and_5_percent(steps):
    assert per_device_bytes(only(steps["guarded"])) <= 1.05 * per_device_bytes(only(steps["keras"]))


def test_the_spike_skipping_guards_plain_step_holds_at_most_keras_step_its_record_and_5_percent(steps):
    # Its record (the window and the rows, what it returns beyond the state) is its statistics, as the
    # probed step's records are. Its sample step (one step in `spike_sample_every`) holds more: it
    # measures the update it applies from the weights before and after it (docs/sharded.md).
    keras_step, (_, plain) = only(steps["keras"]), programs(steps, "skipping")
    record = plain["memory"]["output"] - keras_step["memory"]["output"]
    assert 0 < record < 64 * 1024
    assert per_device_bytes(plain) <= 1.05 * per_device_bytes(keras_step) + record
