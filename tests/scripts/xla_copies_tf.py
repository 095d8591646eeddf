"""What TensorFlow's XLA-compiled train step copies, with `kgrad.NonFiniteGuard` and with spike skipping.

Run by tests/test_spike_skipping_xla_copies.py in its own process: XLA reads
``XLA_FLAGS`` (here, where to dump the compiled programs) once, when it
starts. A small MLP with Adam, with Keras' step and with its own ``train_step``
(a `kgrad.ProbeTape`), is fitted with ``jit_compile=True`` under each
guard; the entry computation of its compiled step (after XLA's
optimizations) is read, and each ``copy`` instruction's bytes added up. A
copy there runs on every step, whichever branch the step takes. Prints one
JSON object: per guard, those bytes, and the bytes of the weights and Adam's
moments.

Run: ``python tests/scripts/xla_copies_tf.py``
"""

import glob
import json
import os
import re
import sys
import tempfile

if __name__ == "__main__":  # (pytest imports this file for its doctests: leave its environment alone)
    DUMP = tempfile.mkdtemp(prefix="kgrad_xla_copies_")
    os.environ["XLA_FLAGS"] = f"--xla_dump_to={DUMP} --xla_dump_hlo_as_text {os.environ.get('XLA_FLAGS', '')}"
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kgrad  # noqa: E402

_BYTES = {"f32": 4, "s64": 8, "s32": 4, "pred": 1}
GUARDS = {"guard": {}, "skip_spikes": dict(skip_spikes=True, spike_sample_every=2)}


class OwnStep(keras.Sequential):
    """The same MLP with its own ``train_step``: the update of its `kgrad.ProbeTape` is judged."""

    def train_step(self, data):
        x, y = data
        with kgrad.ProbeTape(self) as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables),
                                           self.trainable_variables))
        return {"loss": loss}


def copied_bytes(hlo_text):
    """Bytes that the ``copy`` instructions of ``hlo_text``'s entry computation write.

    >>> copied_bytes("ENTRY %main {\\n  %copy.1 = f32[2,3]{1,0} copy(%p)\\n  ROOT %t = () tuple()\\n}\\n")
    24
    """
    entry = hlo_text[hlo_text.index("ENTRY"):]
    entry = entry[: entry.index("\n}")]
    total = 0
    for kind, shape in re.findall(r"= (f32|s64|s32|pred)\[([\d,]*)\]\S* copy\(", entry):
        total += _BYTES[kind] * int(np.prod([int(d) for d in shape.split(",") if d]))
    return total


def _fit(guard_options, own_step):
    keras.utils.set_random_seed(0)
    model = (OwnStep if own_step else keras.Sequential)([
        keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10),
    ])
    model.compile(keras.optimizers.Adam(1e-3), "mse", jit_compile=True)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8 * 32, 64)), rng.normal(size=(8 * 32, 10))
    model.fit(x, y, batch_size=32, verbose=0, callbacks=[kgrad.NonFiniteGuard(**guard_options)])
    return 3 * sum(int(np.prod(w.shape)) * 4 for w in model.trainable_weights)  # weights, m, v


def _step_programs():
    """The compiled train steps dumped so far, oldest first."""
    paths = glob.glob(os.path.join(DUMP, "module_*one_step_on_data*.cpu_after_optimizations.txt"))
    return sorted(paths, key=lambda path: int(re.search(r"module_(\d+)", path).group(1)))


def main():
    report, seen = {}, 0
    for (name, options), own_step in [(guard, own) for own in (False, True) for guard in GUARDS.items()]:
        name = f"{name} (own train_step)" if own_step else name
        state_bytes = _fit(options, own_step)
        programs = _step_programs()
        if len(programs) != seen + 1:
            sys.exit(f"expected one compiled step for {name}, found {len(programs) - seen}")
        seen = len(programs)
        with open(programs[-1]) as text:
            report[name] = {"entry_copy_bytes": copied_bytes(text.read()), "state_bytes": state_bytes}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
