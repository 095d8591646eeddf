"""The names of what kgrad writes: the moments of a tensor and the leaves of a model's inputs and outputs.

Backend-free: the tags a backend's step writes are these names, so that the
logs, the report and the tab read the same tags whichever backend wrote them.

>>> MOMENT_NAMES[0], io_names({"b": 1, "a": 2}, "input"), io_names([1, 2], "output", ["y", "z"])
('norm', ['a', 'b'], ['y', 'z'])
"""

#: The columns of a tensor's summary row, as the step computes them; the
#: scalar tag of a column is ``<kind>_<name>/<layer>`` (``grad_norm/dense``).
MOMENT_NAMES = ("norm", "mean", "std", "min", "max", "zero_fraction", "nonfinite")


def flatten(structure):
    """The leaves of nested dicts (keys sorted), lists and tuples, in the order ``tf.nest`` gives them."""
    if isinstance(structure, dict):
        return [leaf for key in sorted(structure) for leaf in flatten(structure[key])]
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in flatten(item)]
    return [structure]


def io_names(structure, prefix, keras_names=None):
    """Report names for the leaves of a model's inputs or outputs.

    ``"input"`` / ``"output"`` for a single tensor; otherwise dict keys, the
    model's own names, or ``"<prefix>_<i>"``.
    """
    leaves = flatten(structure)
    if len(leaves) == 1:
        return [prefix]
    if isinstance(structure, dict):
        return [str(key) for key in sorted(structure)]
    if keras_names and len(keras_names) == len(leaves):
        return [str(name) for name in keras_names]
    return [f"{prefix}_{index}" for index in range(len(leaves))]


#: The loss of each probed step, unscaled, of the global batch (what Keras trains on).
LOSS_TAG = "global/loss"
#: ‖dJ/dw‖ over all trainable weights.
GRAD_NORM_TAG = "global/grad_norm"
#: ``instruments=["optimizer"]``: per weight, ``<kind>/<weight path>``.
OPTIMIZER_KINDS = ("adam_rms", "grad_outlier_fraction", "update_rms")
#: ``instruments=["logits"]``: per output, ``<kind>_mean/<output>`` (over examples and
#: positions) and ``<kind>_max/<output>``.
LOGIT_KINDS = ("logit_max", "logit_lse", "logit_entropy", "logit_top1_prob")
#: ``instruments=["attention"]``: per attention layer and head,
#: ``<kind>/<layer path>/head_<h>``: ``attention_logit_max`` is the largest
#: pre-softmax score (scaled q·k, masked keys left out) over the sub-batch, query
#: and key positions; ``attention_entropy`` the mean over examples and query
#: positions of the entropy (nats) of the attention weights.
ATTENTION_KINDS = ("attention_logit_max", "attention_entropy")
