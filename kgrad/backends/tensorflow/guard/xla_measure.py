"""The spike rule's measure of an update under XLA: one branch of its own, ordered before the update.

Without XLA the skip's measure sits in the branch of a skipped step, and
the sample in a branch around the update (`kgrad.backends.tensorflow.guard.sentinel`):
a branch not taken costs TensorFlow's executor its every op, and each is
one call op there. Under XLA (``jit_compile=True``, TensorFlow's default on a
GPU) a branch not taken costs nothing, but those branches read the weights
and Adam's moments beside the update that writes them in place, and XLA
orders instructions by their data alone when it decides where a buffer
must be copied. It then copied every weight and both moments on every
step: 4.8 MB a step on the benchmark MLP, 1.12–1.14 of the guard's time
(benchmarks/RESULTS.md, "Why XLA costs more").

Here the skip's and the sample's measures are one branch, before the
update's, and the update's predicate depends on its result: XLA then runs
the measure's reads before the update's writes, and copies nothing outside
the branch. A step run that is neither a skip nor a sample runs no part of
it. The branch applies the update the step makes (or would have made),
measures it and undoes it, bit for bit (`SpikeState.would_be_update`); a
sample step then applies the same update again, as every step does.

Example (graph code of a guarded step compiled by XLA, after the rule's decision)::

    ordered = measure_before_update(spikes, kept, sample, judged, row, optimizer, applied, measured)
    tf.cond(tf.logical_and(may_apply, ordered), update, skipped)
"""

import tensorflow as tf


def measure_before_update(spikes, kept, sample, judged, row, optimizer, applied, measured,
                          inverse_scale=None):
    """Graph code: measures the step's update where ``kept`` or ``sample``; returns a true boolean tensor.

    The update's branch must depend on the returned tensor (``and`` it into
    its predicate): that orders this branch's reads before the update.

    Args:
        spikes: The guard's `kgrad.backends.tensorflow.guard.spikes.SpikeState`.
        kept: The step spiked and its skip is kept (`SpikeState.measure_skip`'s branch).
        sample: The step applies its update and is a sample step (`SampleWindow.sampled_update`'s).
        judged, row: `SpikeState.decide`'s ``judged`` and the step's row.
        optimizer, applied, measured, inverse_scale: As `SpikeState.would_be_update`'s.
    """
    def measure():
        unscaled, values = spikes.would_be_update(optimizer, applied, measured, None, inverse_scale)
        # Selects, not branches: a nested branch would read the tables beside their writes.
        spikes.keep_skip(spikes.skip_table(judged, unscaled, values), row, kept)
        spikes.samples.keep(values, sample)
        return tf.identity(spikes.skip_count)

    count = tf.cond(tf.logical_or(kept, sample), measure, lambda: tf.identity(spikes.skip_count))
    # Never false (a count), which XLA cannot know: the data dependency is the point.
    return count >= 0
