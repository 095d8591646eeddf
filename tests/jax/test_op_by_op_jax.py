"""In a step run op by op (``jit_compile=False``), kgrad's own computations compile once.

kgrad's statistics, checks and spike rule are compiled calls of their own
(`kgrad.backends.jax.summarize.compiled`): one program per shape. Before, each of
their operations compiled on its own, and each ``lax.cond`` they build compiled
again at every call: a second un-jitted fit of the same model with a new probe
(every statistic, two instruments) lowered 192 programs more than a plain fit,
with a new `NonFiniteGuard` 16, with ``skip_spikes=True`` 53. Counted with JAX's own monitoring events: every
program lowered to MLIR, whether or not the persistent compilation cache then
holds it (`benchmarks/op_by_op.py` prints the counts and CPU seconds).
"""

import pytest

import kgrad
from benchmarks.op_by_op import fit, programs_lowered

CALLBACKS = {
    "probe": lambda folder: kgrad.GradientProbe(folder, every_n_steps=1, statistics="all",
                                                instruments=["optimizer", "logits"]),
    "guard": lambda folder: kgrad.NonFiniteGuard(),
    "skip_spikes": lambda folder: kgrad.NonFiniteGuard(skip_spikes=True),
}


@pytest.mark.parametrize("kind", CALLBACKS)
def test_a_second_fit_run_op_by_op_lowers_no_more_programs_than_a_plain_one(kind, tmp_path):
    make = CALLBACKS[kind]
    fit(None)
    fit(make(str(tmp_path / "first")))  # every program of these shapes, once
    with programs_lowered() as plain:
        fit(None)
    with programs_lowered() as watched:
        fit(make(str(tmp_path / "second")))
    assert watched[0] == plain[0], f"{kind}: {watched[0]} programs lowered, a plain fit {plain[0]}"
