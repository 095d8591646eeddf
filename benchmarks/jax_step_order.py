"""What a probed JAX step costs by where it runs: among Keras' steps (every N) or in a run of probed steps.

The jitted steps alone, outside ``fit`` (no callbacks, no host reads, no event
files), on the same batches: Keras' own ``train_step`` and kgrad's probed step
(`kgrad.backends.jax.own_step.parts.ProbedStep`, jitted as kgrad jits it).

- ``sequences``: CPU time of ``--steps`` steps, unsynchronized, as ratios to
  Keras' step alone: a probed step every ``--every`` steps, the same number
  of probed steps first in one block, and every step probed. Medians of
  ``--rounds`` rounds, each runs all sequences in turn.
- ``per position``: synchronized after each step, the median wall and CPU
  milliseconds of each position in a cycle of ``--every`` steps (position 0
  is the probed one), and of a step in a run of probed steps and of Keras'.

Run: KERAS_BACKEND=jax python -m benchmarks.jax_step_order [--every 10] [--steps 400]
"""

import argparse
import os
import statistics
import tempfile
import time

if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402
from benchmarks.models import MODELS, build_model, make_data  # noqa: E402
from kgrad.backends.jax.differentiate.install import probing_train_function  # noqa: E402

_BATCHES = 20


def _steps(spec):
    """``(state(), batches, plain step, probed step)`` of a built and briefly trained ``spec`` model."""
    x, y = make_data(spec, _BATCHES, 0)
    model = build_model(spec, 0, jit_compile=True)
    size = spec.batch_size
    model.fit(x[: 2 * size], y[: 2 * size], batch_size=size, verbose=0)

    def state():  # copies: both steps donate the state they are given
        return tuple(
            [jnp.array(v.value) for v in variables]
            for variables in (model.trainable_variables, model.non_trainable_variables,
                              model.optimizer.variables, model.metrics_variables)
        )

    batches = [(jnp.asarray(x[i * size : (i + 1) * size]), jnp.asarray(y[i * size : (i + 1) * size]))
               for i in range(_BATCHES)]
    config = kgrad.GradientProbe(tempfile.mkdtemp(), every_n_steps=1).config
    plain = jax.jit(model.train_step, donate_argnums=0)
    return state, batches, plain, probing_train_function(model, config, model.train_function)._probed


def _run(steps, pattern, synchronize=False):
    """Runs ``pattern`` (True: probed); ``[(wall s, CPU s)]`` per step when synchronized."""
    state, batches, plain, probed = steps
    values, records, times = state(), [], []
    for index, is_probed in enumerate(pattern):
        wall, cpu = time.perf_counter(), time.process_time()
        if is_probed:
            _, values, record = probed(values, batches[index % _BATCHES])
            records.append(record)
        else:
            _, values = plain(values, batches[index % _BATCHES])
        if synchronize:
            jax.block_until_ready((values, records))
            times.append((time.perf_counter() - wall, time.process_time() - cpu))
    jax.block_until_ready((values, records))
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--every", type=int, default=10, help="A probed step every this many steps.")
    parser.add_argument("--steps", type=int, default=400, help="Steps per sequence.")
    parser.add_argument("--rounds", type=int, default=7, help="Rounds of the unsynchronized sequences.")
    args = parser.parse_args(argv)
    steps = _steps(MODELS[args.model])
    n, every = args.steps, args.every
    sequences = {
        "plain": [False] * n,
        f"every {every}": [i % every == 0 for i in range(n)],
        "probed first, in a block": [i < len(range(0, n, every)) for i in range(n)],
        "every step": [True] * n,
    }
    for pattern in sequences.values():  # compiles both steps; warms the caches
        _run(steps, pattern[:30])
    seconds = {name: [] for name in sequences}
    for _ in range(args.rounds):
        for name, pattern in sequences.items():
            start = time.process_time()
            _run(steps, pattern)
            seconds[name].append(time.process_time() - start)
    print(f"sequences of {n} steps, CPU time / Keras' steps alone (median [range] of {args.rounds}):")
    for name in sequences:
        ratios = [a / b for a, b in zip(seconds[name], seconds["plain"])]
        print(f"  {name:26s} {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
    cycle = np.array([_run(steps, sequences[f"every {every}"], synchronize=True) for _ in range(3)])
    print(f"per position, synchronized after each step (median ms of 3 x {n // every}):")
    for position in range(every):
        wall, cpu = np.median(cycle[:, position::every], axis=(0, 1)) * 1e3
        label = "probed" if position == 0 else "Keras'"
        print(f"  position {position} ({label}): wall {wall:.3f} ms, CPU {cpu:.3f} ms")
    for name in ("every step", "plain"):
        wall, cpu = np.median(_run(steps, sequences[name][:300], synchronize=True), axis=0) * 1e3
        print(f"  {name:10s} wall {wall:.3f} ms, CPU {cpu:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
