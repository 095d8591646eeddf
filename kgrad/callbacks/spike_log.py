"""The host side of `kgrad.NonFiniteGuard`'s ``skip_spikes``: what it reads, keeps and writes.

Each backend keeps the spike rule's state on the device and hands a
`kgrad.plan.spike_rule.SpikeSnapshot` when the host reads it: after a skip
(the flag comes back with the step's logs, as a trip's does), at an epoch's
end, or when its buffer of per-step rows is full. `SpikeLog` turns the new
rows and skipped steps of each snapshot into `SkippedStep`s and TensorBoard
scalars (`kgrad.plan.tag_names`, docs/tags.md), written to ``<log_dir>/kgrad``.
"""

import dataclasses
import math
import os

from kgrad.logs.spike_events import SpikeEvents
from kgrad.plan.spike_rule import SKIP_COLUMNS, SKIP_SLOTS, SKIP_VALUES

#: Why a sampled value's z-score is absent before its weight has two samples.
FEW_SAMPLES = ("fewer than 2 samples yet (one every {every} steps, where its update is applied; {count} at "
               "this step): {value} is kept for applied updates by sampling, as σ (n − 1) needs two")
#: Why a z-score is absent for some weights although the step had enough history.
NO_SPREAD = ("its running statistics have fewer than 2 finite values, or σ 0, for {weights} "
             "(an update ratio of a weight that was 0 is not finite)")


@dataclasses.dataclass(frozen=True)
class SkippedStep:
    """One step whose update the guard skipped because it spiked.

    Attributes:
        step: ``optimizer.iterations`` of the step.
        values: ``{value name: {weight path: float}}`` for the value names of
            `kgrad.plan.spike_rule.SKIP_VALUES` (``adam_rms`` absent without a
            second moment).
        z_scores: ``{value name: {weight path: z}}``: each value against the
            weight's running statistics (the gradient norm's window of
            accepted steps; the others' samples, one every few steps);
            only where they exist (never 0 for a missing one).
        absent: ``{value name: reason}`` for what is not in ``values`` or ``z_scores``.
        part: The differentiated part (a model's own ``train_step``), or ``None``.
    """

    step: int
    values: dict
    z_scores: dict
    absent: dict
    part: object = None


class SpikeLog:
    """The rows and skipped steps read so far from one part's spike state.

    Args:
        log_dir: Where the tags go (``<log_dir>/kgrad``), or ``None``.
        part: The part's name, or ``None`` for the model.
        first_step: The number of the fit's first step (``optimizer.iterations``
            when it began): the device numbers the steps it runs from 0.
    """

    def __init__(self, log_dir, part=None, first_step=0):
        self.part = part
        self.first_step = first_step
        run = None if log_dir is None else os.path.join(os.fspath(log_dir), "kgrad")
        self._events = None if run is None else SpikeEvents(run if part is None else os.path.join(run, part))
        self._rows_read = 0
        self._skips_read = 0
        self.rows_lost = 0
        self.skips_lost = 0
        self.rows = []  # (step, {tag: value}) of every step read
        self.skipped = []

    def take(self, snapshot):
        """Reads the new rows and skipped steps of ``snapshot``; returns the new `SkippedStep`s."""
        capacity = len(snapshot.rows)
        first = max(self._rows_read, snapshot.row_count - capacity)
        self.rows_lost += first - self._rows_read
        for index in range(first, snapshot.row_count):
            step, scalars = row_scalars(snapshot.rows[index % capacity])
            step += self.first_step
            self.rows.append((step, scalars))
            if self._events is not None:
                self._events.write(step, scalars)
        self._rows_read = snapshot.row_count
        first = max(self._skips_read, snapshot.skip_count - SKIP_SLOTS)
        self.skips_lost += first - self._skips_read
        new = []
        for index in range(first, snapshot.skip_count):
            slot = index % SKIP_SLOTS
            skipped = skipped_step(
                self.first_step + int(snapshot.skip_steps[slot]), snapshot.skip_values[slot],
                snapshot.weights, snapshot.adam_reason, self.part, snapshot.sample_every,
                snapshot.sample_reason,
            )
            new.append(skipped)
            if self._events is not None:
                self._events.write(skipped.step, skip_scalars(skipped))
        self._skips_read = snapshot.skip_count
        self.skipped += new
        if self._events is not None:
            self._events.flush()
        return new

    def close(self):
        if self._events is not None:
            self._events.close()


def row_scalars(row):
    """``(step, {tag: value})`` of one per-step row; a value the step could not compute is left out."""
    step, skipped, score, mean_loss, std_loss, mean_norm, std_norm = (float(v) for v in row)
    named = {
        "global/spike_score": score,
        "spike_window_mean/log_loss": mean_loss, "spike_window_std/log_loss": std_loss,
        "spike_window_mean/log_grad_norm": mean_norm, "spike_window_std/log_grad_norm": std_norm,
    }
    scalars = {"global/step_skipped": skipped}
    scalars.update({tag: value for tag, value in named.items() if math.isfinite(value)})
    return int(step), scalars


def skipped_step(step, table, weights, adam_reason, part=None, sample_every=1, sample_reason=None):
    """The `SkippedStep` of one ``[weights, len(SKIP_COLUMNS)]`` table.

    ``sample_every`` and ``sample_reason``: the `kgrad.plan.spike_rule.SpikeSnapshot`'s, for why a
    z-score of a sampled value is absent.
    """
    values, z_scores, absent = {}, {}, {}
    samples = int(table[0, SKIP_COLUMNS.index("samples")]) if len(weights) else 0
    for column, name in enumerate(SKIP_VALUES):
        present = {w: float(table[i, column]) for i, w in enumerate(weights)
                   if math.isfinite(table[i, column])}
        if present:
            values[name] = present
        elif name == "adam_rms" and adam_reason:
            absent[name] = f"the optimizer {adam_reason}"
        z_column = SKIP_COLUMNS.index(f"z_{name}")
        z = {w: float(table[i, z_column]) for i, w in enumerate(weights) if math.isfinite(table[i, z_column])}
        if z:
            z_scores[name] = z
        missing = [w for w in weights if w in present and w not in z]
        if name in absent:
            absent[f"z_{name}"] = f"{name} is absent: {absent[name]}"
        elif name != "grad_norm" and sample_reason:
            absent[f"z_{name}"] = sample_reason
        elif name != "grad_norm" and samples < 2:
            absent[f"z_{name}"] = FEW_SAMPLES.format(every=sample_every, count=samples, value=name)
        elif missing:
            absent[f"z_{name}"] = NO_SPREAD.format(weights=", ".join(missing))
    return SkippedStep(step, values, z_scores, absent, part)


def skip_scalars(skipped):
    """``{tag: value}`` of a `SkippedStep`: ``skip_<value>/<weight>`` and ``skip_z_<value>/<weight>``."""
    scalars = {}
    for name, per_weight in skipped.values.items():
        scalars.update({f"skip_{name}/{weight}": value for weight, value in per_weight.items()})
    for name, per_weight in skipped.z_scores.items():
        scalars.update({f"skip_z_{name}/{weight}": value for weight, value in per_weight.items()})
    return scalars
