"""The guard on a model's own ``train_step`` of two parts, single-device or under a strategy.

Imported by tests/test_distribute.py for the single-device reference, and by
``distributed_fit.py`` for its mirrored subprocess (`save_runs`). The model,
`TwoParts`, trains two linear regressors in one step, each with a
`kgrad.ProbeTape` and an Adam optimizer of its own: part ``first`` reads the
inputs ``a`` through a synchronized BatchNormalization (the global batch's
statistics, as on one device), part ``second`` the inputs ``b``. A NaN in
``a`` or a spike in part ``first``'s targets concerns the part ``first``
only; its BatchNormalization's moving statistics, written by the forward
pass, are put back with the skipped update.
"""

import json
import os

import numpy as np

try:  # imported by the tests (tests/ on the path)
    from scripts import distributed_fit as common
except ImportError:  # imported by distributed_fit.py run as a script (its folder on the path)
    import distributed_fit as common

BATCHES = 50
FEATURES = 4
#: The example of ``a`` given a NaN: batch 3's seventh, in the second replica's half of it.
NAN_EXAMPLE = 3 * common.GLOBAL_BATCH + 6
#: The batch whose targets of part ``first`` are scaled x1000 in the spike run.
SPIKE_BATCH = 40


def two_parts(strategy):
    """`TwoParts`, compiled under ``strategy``, with fixed weights."""
    import keras

    import kgrad

    class TwoParts(keras.Model):
        def __init__(self):
            super().__init__(name="two_parts")
            self.first = keras.Sequential([
                keras.Input((FEATURES,)),
                keras.layers.BatchNormalization(synchronized=True, name="first_norm"),
                keras.layers.Dense(1, name="first_out"),
            ], name="first")
            self.second = keras.Sequential(
                [keras.Input((FEATURES,)), keras.layers.Dense(1, name="second_out")], name="second"
            )

        def compile(self):
            super().compile(jit_compile=False)
            self.first_optimizer = keras.optimizers.Adam(0.01)
            self.second_optimizer = keras.optimizers.Adam(0.01)
            # A Keras loss: each replica's loss is its share of the global one.
            self.loss_fn = keras.losses.MeanSquaredError()

        def call(self, inputs):
            return self.first(inputs[0]) + self.second(inputs[1])

        def train_step(self, data):
            (a, b), (y_a, y_b) = data
            losses = {}
            for name, net, x, y, optimizer in (
                ("first", self.first, a, y_a, self.first_optimizer),
                ("second", self.second, b, y_b, self.second_optimizer),
            ):
                with kgrad.ProbeTape(net) as tape:
                    loss = self.loss_fn(y, net(x, training=True))
                grads = tape.gradient(loss, net.trainable_weights)
                optimizer.apply_gradients(zip(grads, net.trainable_weights))
                losses[name] = loss
            return losses

    with strategy.scope():
        model = TwoParts()
        model.compile()
        for net, scale in ((model.first, 0.3), (model.second, -0.2)):
            net.layers[-1].set_weights([np.full((FEATURES, 1), scale, "float32"), np.zeros(1, "float32")])
        # Built before fit: Keras 3.15 itself fails under MirroredStrategy (with or without
        # kgrad) on an own step whose optimizers build in it ("You must feed a value for
        # placeholder tensor").
        model.first_optimizer.build(model.first.trainable_variables)
        model.second_optimizer.build(model.second.trainable_variables)
    common._work_around_if_multi_worker(model)
    return model


def data():
    """``(x, y)`` of `BATCHES` global batches: ``x = (a, b)``, each part's target its inputs' sum."""
    rng = np.random.default_rng(1)
    a, b = (rng.uniform(-1, 1, (BATCHES * common.GLOBAL_BATCH, FEATURES)).astype("float32") for _ in "ab")
    return (a, b), (a.sum(axis=1, keepdims=True), b.sum(axis=1, keepdims=True))


def _part_states(model, part_states):
    """Callbacks appending, at each batch end, every replica's copy of each part's weights and Adam's."""
    return [
        common._states(
            model, states, getattr(model, name).weights + getattr(model, f"{name}_optimizer").variables
        )
        for name, states in part_states.items()
    ]


def _iterations(model):
    return {name: int(getattr(model, f"{name}_optimizer").iterations.numpy()) for name in ("first", "second")}


def own_nan(strategy):
    """A run whose batch 3 holds a NaN in ``a``: ``(report fields, {part: per-batch states})``."""
    import kgrad

    model = two_parts(strategy)
    (a, b), y = data()
    a[NAN_EXAMPLE, 2] = np.nan
    guard, states = kgrad.NonFiniteGuard(), {"first": [], "second": []}
    model.fit((a, b), y, batch_size=common.GLOBAL_BATCH, shuffle=False, verbose=0,
              callbacks=[guard, *_part_states(model, states)])
    report = guard.report
    fields = {
        "step": report.step, "tensor": report.tensor, "last_finite_step": report.last_finite_step,
        "last_finite_norm": report.last_finite_norm, "replay_note": report.replay_note,
        "non_finite": {name: [float(c) for c in counts] for name, counts in report.non_finite.items()},
        "iterations": _iterations(model),
    }
    return fields, states


def own_spike(strategy, log_dir):
    """A run whose batch 40's targets of ``first`` are x1000, skipping spikes: ``(fields, states)``."""
    import kgrad
    from kgrad.backends.tensorflow.handover.replicas import is_chief

    model = two_parts(strategy)
    x, (y_a, y_b) = data()
    y_a[SPIKE_BATCH * common.GLOBAL_BATCH : (SPIKE_BATCH + 1) * common.GLOBAL_BATCH] *= 1000.0
    guard = kgrad.NonFiniteGuard(skip_spikes=True, spike_window=16, spike_sample_every=1, log_dir=log_dir)
    states = {"first": [], "second": []}
    with common._kgrad_reads() as (reads, phase):
        model.fit(x, (y_a, y_b), batch_size=common.GLOBAL_BATCH, shuffle=False, verbose=0,
                  callbacks=[phase, guard, *_part_states(model, states)])
    skipped = guard.skipped_steps[0]
    # Only the chief of several workers writes logs (`series` is then the chief's alone).
    logs = kgrad.read_logs(log_dir) if is_chief(strategy) else {}
    fields = {
        "skipped": [[s.step, s.part] for s in guard.skipped_steps], "iterations": _iterations(model),
        "values": skipped.values, "z_scores": skipped.z_scores,
        "series": {f"{part}/{tag}": [series.steps.tolist(), series.values.tolist()]
                   for part in ("first", "second") if f"kgrad/{part}" in logs
                   for tag, series in logs[f"kgrad/{part}"]["scalars"].items()
                   if tag in common.SPIKE_TAGS},
        "stopped": guard.spike_report is not None or guard.report is not None,
        "reads": sorted(reads),
        "weights": [w.tolist() for w in model.get_weights()],
        # What kgrad replaced for the fit (its replicas' ProbeTapes interleave), and left behind.
        "left_replaced": [
            owner.name for owner in [model.first, model.second, *model.first.layers, *model.second.layers]
            if "call" in owner.__dict__
        ] + [name for name in ("first", "second") if "apply" in getattr(model, f"{name}_optimizer").__dict__],
    }
    return fields, states


def save_runs(out_dir, strategy, spike_logs, names=("own_nan", "own_spike")):
    """Writes the results of the runs ``names`` under ``out_dir`` (JSON, and each part's states)."""
    runs = {"own_nan": own_nan, "own_spike": lambda s: own_spike(s, spike_logs)}
    for name in names:
        fields, states = runs[name](strategy)
        with open(os.path.join(out_dir, f"{name}.json"), "w") as file:
            json.dump(fields, file)
        for part, part_states in states.items():
            common.save_states(os.path.join(out_dir, f"{name}_{part}.npz"), part_states)
