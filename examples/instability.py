"""kgrad sees a blow-up coming: a tiny KerasHub GPT-2 whose learning rate jumps ×100 at step 50.

A 2-layer GPT-2 (KerasHub, built from a config: nothing is downloaded) learns a
toy language, sequences that count up modulo 32 by a stride of 1, 2 or 3, with
Adam at its default rate, 1e-3; a learning-rate schedule raises it ×100 at step
50. A `kgrad.GradientProbe` with ``instruments=["optimizer", "logits",
"attention"]`` probes every step; from its event files, kgrad's stability report
(``kgrad report``'s rule: a probe above mean + 6σ of the previous 128 probes)
finds the loss spike and what spiked before it. The script prints how many
probes ahead of the loss spike kgrad flagged something, how many signals spiked
there at once (a tie: which moved first is not known) and the largest, and what
the loss itself said at that probe.

What to expect (seeds 0-7): step 50's update is the first with the raised rate,
so step 51's probe is the first that can see it. There every layer's
``adam_rms`` and the attention layers' largest score spike by tens of σ, while the
loss, though it has begun to rise (by 6-55%), is within 3σ of its previous probes
(whose σ includes its early descent); the loss spike by the same rule follows 1-3
probes later. Flags before the raise are
noise of a small model's early training: printed apart, never counted.

Run: ``python examples/instability.py [LOG_DIR] [SEED]`` (15-30 s on 2 CPU
cores), then ``kgrad report LOG_DIR``. The example's own code is not
TensorFlow-only (``keras.ops``, NumPy, kgrad's TF-free readers); it runs
wherever kgrad's three instruments run.
"""

import contextlib
import os
import sys
import tempfile


@contextlib.contextmanager
def _stderr_held_back():
    """Holds back what is written to stderr (file descriptor 2); shows it only on an error.

    KerasHub imports TensorFlow, on every backend, and TensorFlow 2.21 writes its
    start-up lines (twice: one set per library it loads) from C++ before it reads
    ``TF_CPP_MIN_LOG_LEVEL``.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
with _stderr_held_back():
    import keras
    import keras_hub

import numpy as np  # noqa: E402

import kgrad  # noqa: E402

VOCABULARY, LENGTH, BATCH, STEPS = 32, 16, 32, 80
LEARNING_RATE, RAISE_STEP, FACTOR = 1e-3, 50, 100.0
OUTPUT = "output"  # how kgrad names a single-output model's output (logit_max_max/output)


class RaiseAt(keras.optimizers.schedules.LearningRateSchedule):
    """``rate`` before ``step``, ``rate * factor`` from it on.

    A schedule rather than a callback that assigns ``optimizer.learning_rate``:
    the optimizer evaluates it at its own ``iterations`` inside the compiled
    step, so the raise lands on exactly that update on every backend (a batch
    callback fires once per ``steps_per_execution`` call, and on JAX ``fit``
    keeps the optimizer's variables in its own state while it runs).
    """

    def __init__(self, rate, step, factor):
        self.rate, self.step, self.factor = rate, step, factor

    def __call__(self, step):
        raised = keras.ops.greater_equal(step, self.step)
        return keras.ops.where(raised, self.rate * self.factor, self.rate)

    def get_config(self):
        return {"rate": self.rate, "step": self.step, "factor": self.factor}


def make_data(seed):
    """``STEPS`` batches of the toy language: inputs (token ids, padding mask) and next tokens."""
    rng = np.random.default_rng(seed)
    count = BATCH * STEPS
    start = rng.integers(0, VOCABULARY, size=(count, 1))
    stride = rng.integers(1, 4, size=(count, 1))
    sequences = (start + stride * np.arange(LENGTH + 1)) % VOCABULARY
    inputs = {"token_ids": sequences[:, :-1].astype("int32"),
              "padding_mask": np.ones((count, LENGTH), "int32")}
    return inputs, sequences[:, 1:].astype("int32")


def build_model():
    """GPT-2's architecture at toy size (KerasHub's defaults otherwise, dropout 0.1 included)."""
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=LENGTH)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def train(log_dir, seed):
    """Trains with the raise and the probe; returns the model."""
    keras.utils.set_random_seed(seed)
    inputs, targets = make_data(seed)
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(RaiseAt(LEARNING_RATE, RAISE_STEP, FACTOR)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=[])
    # Every step, so that a lead is counted in steps; only what the stability signals
    # need: adam_rms/ (the weight gradients and Adam's state), the output's max logit,
    # each attention layer's largest score (on attention_examples=4 examples).
    probe = kgrad.GradientProbe(log_dir, every_n_steps=1, capture=["weight_gradients"],
                                histograms=False, instruments=["optimizer", "logits", "attention"])
    model.fit(inputs, targets, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[probe])
    return model


def first_loss_spike_after_raise(report):
    """The first loss spike after the raise (the blow-up), or ``None``."""
    return next((spike for spike in report.loss_spikes if spike.step > RAISE_STEP), None)


def first_flag(loss_spike):
    """The largest first layer signal that spiked after the raise, ahead of ``loss_spike``, or ``None``.

    The first update with the raised rate is step ``RAISE_STEP``'s, so probes
    up to that step cannot have seen it.
    """
    after = [lead for lead in loss_spike.leaders if lead.step > RAISE_STEP]
    return next((lead for lead in after if lead.probes_ahead > 0), None)


def sigmas_above(report, lead):
    """How far above its previous probes' mean a signal was when it spiked, in their σ."""
    spike = next(spike for spike in report.spikes[lead.tag] if spike.step == lead.step)
    return (spike.value - spike.mean) / spike.std if spike.std > 0 else float("inf")


def describe_run(scalars, report):
    """The lines the example prints: the loss spike, what kgrad flagged first, the loss around it."""
    loss_spike = first_loss_spike_after_raise(report)
    if loss_spike is None:
        return ["kgrad found no loss spike after the raise (the loss stayed within mean + 6σ)."]
    lines = [f"loss spike at step {loss_spike.step}: {loss_spike.value:.3g} "
             f"(mean of the previous probes {loss_spike.mean:.3g} ± {loss_spike.std:.3g})"]
    lead = first_flag(loss_spike)
    if lead is None:
        lines.append("kgrad flagged nothing ahead of it: the first signals spiked in the same probe.")
        return lines
    # A probe's signals are a tie (which moved first is not known), largest first: the lead is the largest.
    same_probe = [other for other in loss_spike.leaders if other.step == lead.step]
    ahead = f"{lead.probes_ahead} probe{'s' if lead.probes_ahead > 1 else ''}"
    lines.append(f"kgrad flagged it {ahead} ahead, at step {lead.step}: {len(same_probe)} layer signals "
                 f"spiked there at once, the largest {lead.layer} ({lead.signal}, "
                 f"{sigmas_above(report, lead):.0f}σ)")
    return lines + loss_lines(scalars["global/loss"], lead, loss_spike, report)


def loss_lines(loss, lead, loss_spike, report):
    """What the loss said at the flagged probe (in the rule's σ) and from the raise to the spike."""
    loss = dict(zip(loss.steps.tolist(), loss.values.tolist()))
    previous = np.array([value for step, value in loss.items() if step < lead.step][-report.history:])
    previous = previous[np.isfinite(previous)]
    sigmas = (loss[lead.step] - previous.mean()) / previous.std()
    lines = [f"the loss at that probe: {loss[lead.step]:.3g}, {sigmas:+.1f}σ from the mean of its "
             f"previous probes (a spike is +{report.sigmas:g}σ); at step {RAISE_STEP}: "
             f"{loss[RAISE_STEP]:.3g}"]
    marks = {lead.step: " (flagged)", loss_spike.step: " (loss spike)"}
    shown = [f"{step}: {loss[step]:.3g}{marks.get(step, '')}"
             for step in sorted(loss) if RAISE_STEP - 1 <= step <= loss_spike.step]
    lines.append("loss by step: " + ", ".join(shown))
    noise = [f"{other.layer} ({other.signal}) at step {other.step}"
             for other in loss_spike.leaders if other.step <= RAISE_STEP]
    if noise:
        more = f" and {len(noise) - 3} more" if len(noise) > 3 else ""
        lines.append(f"spiked before the raise (noise, not counted): {', '.join(noise[:3])}{more}")
    return lines


def main(log_dir="logs/instability", seed=0):
    train(log_dir, seed)
    logs = kgrad.read_logs(log_dir)
    (run,) = kgrad.health_report(logs)  # its .stability: kgrad report's spikes, as data
    scalars = logs[run.run]["scalars"]
    print(f"learning rate {LEARNING_RATE:g}, x{FACTOR:g} from step {RAISE_STEP}; seed {seed}")
    print("\n".join(describe_run(scalars, run.stability)))


if __name__ == "__main__":
    main(*sys.argv[1:2], *[int(value) for value in sys.argv[2:3]])
