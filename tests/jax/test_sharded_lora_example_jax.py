"""examples/sharded_lora.py: a LoRA-tuned Gemma split over 8 devices logs its LoRA gradients and its heads.

The example runs in a fork of the preloaded Python (tests/forked_python.py; the
8 simulated devices are set before JAX starts its backend there). Its logs
are read back: the LoRA weights' gradients equal, step by step, those of the
same model and batches on one device in this process (``jax.grad`` of Keras'
stateless loss, Adam applied with ``stateless_apply``), and the attention
instrument logs every head of both layers.
"""

import pathlib
import sys

import jax
import numpy as np
import pytest

import kgrad

keras_hub = pytest.importorskip("keras_hub")
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import sharded_lora  # noqa: E402  (the model and the data, built here on one device)


@pytest.fixture(scope="module")
def example(preloaded_python, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded_lora")
    # Under a minute on 2 loaded cores; the timeout only stops a hung run.
    status, stdout, stderr = preloaded_python.run_script(EXAMPLES / "sharded_lora.py", [folder / "logs"],
                                                         folder, timeout=300)
    assert status == 0, stderr[-3000:]
    return stdout, stderr, kgrad.read_logs(str(folder / "logs"))["kgrad"]


def one_device_gradients():
    """``[{LoRA weight path: its gradient}]`` of each step of the example's fit, on one device."""
    model = sharded_lora.build(None)
    trainable, optimizer = model.trainable_variables, model.optimizer
    optimizer.build(trainable)
    frozen = [v.value for v in model.non_trainable_variables]

    def loss(values, inputs, targets):
        logits, _ = model.stateless_call(values, frozen, inputs, training=True)
        return model.loss(targets, logits)

    gradient = jax.jit(jax.grad(loss))
    values, optimizer_values = [v.value for v in trainable], [v.value for v in optimizer.variables]
    inputs, targets = sharded_lora.data()
    steps = []
    for step in range(sharded_lora.STEPS):
        batch = slice(step * sharded_lora.BATCH, (step + 1) * sharded_lora.BATCH)
        gradients = gradient(values, {k: v[batch] for k, v in inputs.items()}, targets[batch])
        steps.append({v.path: np.asarray(g, np.float64) for v, g in zip(trainable, gradients)})
        values, optimizer_values = optimizer.stateless_apply(optimizer_values, gradients, values)
    return steps


def test_the_model_is_split_and_only_lora_trains(example):
    stdout, _, _ = example
    assert "devices: 8, token embedding (64, 16) split as P('model', 'batch')" in stdout
    trained = stdout.split("trained: ")[1].splitlines()[0].split(", ")
    assert len(trained) == 8 and all("lora_kernel_" in path for path in trained), trained
    assert "guard: no trip" in stdout


def test_per_example_says_why_it_has_nothing_to_log(example):
    _, stderr, logs = example
    assert "no per-example gradient norms for" in stderr and "EinsumDense with LoRA" in stderr
    assert not [tag for tag in logs["scalars"] if tag.startswith("example_grad_norm")]


def test_the_lora_gradients_are_one_devices(example):
    _, _, logs = example
    scalars = logs["scalars"]
    expected = one_device_gradients()
    assert len(expected[0]) == 8
    for path in expected[0]:
        for stat, reference in (("norm", lambda g: np.sqrt((g**2).sum())), ("mean", np.mean),
                                ("max", np.max), ("min", np.min)):
            series = scalars[f"weight_grad_{stat}/{path}"]
            assert series.steps.tolist() == list(range(sharded_lora.STEPS))
            got, want = series.values, [reference(step[path]) for step in expected]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8, err_msg=f"{stat} {path}")
        # LoRA's B starts at 0, so A's first gradient is exactly 0, and then it is not.
        if path.endswith("lora_kernel_a"):
            assert scalars[f"weight_grad_norm/{path}"].values[0] == 0
            assert scalars[f"weight_grad_zero_fraction/{path}"].values[0] == 1
        assert (scalars[f"weight_grad_norm/{path}"].values[1:] > 0).all(), path
        assert (scalars[f"weight_grad_nonfinite/{path}"].values == 0).all(), path
        assert logs["histograms"][f"weight_grad_hist/{path}"].values.shape[0] == sharded_lora.STEPS


def test_the_attention_instrument_logs_every_head(example):
    _, _, logs = example
    scalars = logs["scalars"]
    heads = sorted(tag for tag in scalars if tag.startswith("attention_entropy/"))
    assert heads == [f"attention_entropy/decoder_block_{layer}/attention/head_{head}"
                     for layer in range(2) for head in range(4)]
    for tag in heads:
        values = scalars[tag].values
        assert len(values) == sharded_lora.STEPS and np.isfinite(values).all(), tag
        # Entropy of the softmax over at most LENGTH keys (causal): between 0 and log(LENGTH).
        assert (values > 0).all() and (values < np.log(sharded_lora.LENGTH)).all(), tag
    logits = [tag for tag in scalars if tag.startswith("logit_")]
    assert logits and all(np.isfinite(scalars[tag].values).all() for tag in logits)
