"""‖w‖ before a probed step's update and ‖Δw‖ after it, for all tracked weights in one pass.

`ProbePipeline` writes ``weight_norm/`` from the weights before the update and
``update_ratio/`` (and ``update_rms/``) from their change: the weights are
flattened and concatenated, their squares summed per weight by one fused kernel
each, in one call (`kgrad.backends.tensorflow.summarize.one_pass.split_sums_of_squares`),
and the copy kept for after the update is one flat
variable per pass, not one per weight. Per weight that was a norm, a copy, a
difference and a norm again, dispatched one by one: on a small model the
dispatch, not the arithmetic, is the cost (issue 42). A pass holds at most
`kgrad.backends.tensorflow.summarize.optimizer_state.CHUNK_ENTRIES` entries
(a bigger weight is a pass of its own), so its temporaries stay bounded.

The norms are of every entry, NaN or Inf where an entry is (as
`kgrad.backends.tensorflow.summarize.norms.l2_norm`'s).

Example:

>>> import keras, tensorflow as tf
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> snapshots = WeightSnapshots(model)
>>> kernel, bias = model.layers[0].kernel, model.layers[0].bias
>>> _ = kernel.assign([[3.0], [4.0]]), bias.assign([12.0])
>>> snapshots.norms_before([kernel, bias]).numpy().tolist()
[5.0, 12.0]
>>> _ = kernel.assign([[3.0], [1.0]]), bias.assign([7.0])
>>> snapshots.changes([kernel, bias]).numpy().tolist()
[3.0, 5.0]
"""

import math

import tensorflow as tf

from kgrad.backends.tensorflow.handover import replicas
from kgrad.backends.tensorflow.summarize import one_pass
from kgrad.backends.tensorflow.summarize.optimizer_state import CHUNK_ENTRIES, chunks, flat_entries


class WeightSnapshots:
    """The weights' copy before the update, and the per-weight norms of them and of their change.

    Args:
        model: The model whose distribution strategy creates the copy's variables.
        chunk_entries: The most entries one pass concatenates.
    """

    def __init__(self, model, chunk_entries=CHUNK_ENTRIES):
        self._model = model
        self._chunk_entries = chunk_entries
        self._sizes = None
        self._passes = []  # ranges of weight positions, one per pass
        self._variables = []  # one flat float32 copy per pass

    def norms_before(self, weights):
        """Graph code: ``[n]`` ‖w‖ of ``weights`` now, and keeps their values for `changes`."""
        self._ensure_variables(weights)
        norms = []
        for positions, variable in zip(self._passes, self._variables):
            flat = flat_entries([weights[position].value for position in positions])
            variable.assign(flat)
            norms.append(self._segment_norms(flat, positions))
        return _joined(norms)

    def changes(self, weights):
        """Graph code: ``[n]`` ‖w − w before‖, the same weights as `norms_before` was given."""
        changes = []
        for positions, variable in zip(self._passes, self._variables):
            flat = flat_entries([weights[position].value for position in positions])
            changes.append(self._segment_norms(flat - variable.value(), positions))
        return _joined(changes)

    def _segment_norms(self, flat, positions):
        sizes = [self._sizes[position] for position in positions]
        if len(sizes) == 1:
            return tf.sqrt(2.0 * tf.nn.l2_loss(flat))[tf.newaxis]  # one fused kernel
        # One call: a segment sum scattered every entry (2 × 7 ms a
        # probed MLP step, the most costly op the probe added).
        return tf.sqrt(one_pass.split_sums_of_squares(flat, sizes))

    def _ensure_variables(self, weights):
        sizes = [math.prod(weight.shape) for weight in weights]
        if sizes == self._sizes:
            return
        passes = list(chunks(sizes, self._chunk_entries))
        totals = [sum(sizes[position] for position in positions) for positions in passes]
        # Replicas trace in parallel threads and each must reach create_variables
        # (a merge_call): nothing is set before it returns.
        variables = replicas.create_variables(
            self._model,
            lambda: [replicas.state_variable(tf.zeros([total], tf.float32), "kgrad_snapshot")
                     for total in totals],
        )
        self._sizes, self._passes, self._variables = sizes, passes, variables


def _joined(parts):
    if not parts:
        return tf.zeros([0])
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)
