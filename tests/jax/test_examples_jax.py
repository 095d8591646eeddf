"""The JAX examples run, and what they print and write is what the probe logged."""

import os
import pathlib
import re
import subprocess
import sys

import kgrad

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
NUMBER = r"([-+0-9.e]+)"


def test_the_jax_gan_example_logs_each_sub_model_as_a_run_of_its_own(tmp_path):
    environment = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "jax_gan.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=180, env=environment, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert f"logs: {tmp_path} (runs discriminator, generator); see them with: kgrad report {tmp_path}" in out
    logs = kgrad.read_logs(str(tmp_path))
    assert sorted(logs) == ["discriminator/kgrad", "generator/kgrad"]
    for part, hidden in (("discriminator", "d_hidden"), ("generator", "g_hidden")):
        step, activation, weight = re.search(
            rf"{part}: step (\d+), \|dJ/d\(activation\)\| of {hidden} = {NUMBER}, "
            rf"\|dJ/dw\| of {hidden}/kernel = {NUMBER}",
            out,
        ).groups()
        scalars = logs[f"{part}/kgrad"]["scalars"]
        # 3 epochs of 8 batches, every 4th step probed, at each optimizer's iterations.
        assert scalars[f"grad_norm/{hidden}"].steps.tolist() == [0, 4, 8, 12, 16, 20] and step == "20"
        assert float(activation) == float(f"{scalars[f'grad_norm/{hidden}'].values[-1]:.3g}")
        assert float(weight) == float(f"{scalars[f'weight_grad_norm/{hidden}/kernel'].values[-1]:.3g}")
        assert 0 < float(activation) < 10 and 0 < float(weight) < 10
