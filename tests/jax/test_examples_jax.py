"""The JAX examples run, and what they print and write is what the probe logged."""

import pathlib
import re

import kgrad

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
NUMBER = r"([-+0-9.e]+)"


def test_the_jax_gan_example_logs_each_sub_model_as_a_run_of_its_own(preloaded_python, tmp_path):
    # `python examples/jax_gan.py` in a fork of a Python that imported Keras (on this run's
    # backend, JAX) and kgrad (tests/forked_python.py): the example as a user runs it, without
    # the fresh process's imports.
    log_dir = tmp_path / "logs"
    status, out, stderr = preloaded_python.run_script(EXAMPLES / "jax_gan.py", [log_dir], tmp_path / "run",
                                                      timeout=180)
    assert status == 0, stderr[-3000:]
    assert f"logs: {log_dir} (runs discriminator, generator); see them with: kgrad report {log_dir}" in out
    logs = kgrad.read_logs(str(log_dir))
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
