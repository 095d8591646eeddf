"""The tag contract: every tag kgrad writes, each prefix with its one-line description.

Backend-free and written once: the steps of both backends (`kgrad.ProbeTape`
on TensorFlow, `kgrad.value_and_grad` on JAX) write these tags, the writer
describes them from `describe_tag` (TensorBoard's tooltips), the report and
the tab read them, and ``docs/tags.md`` lists exactly `tag_prefixes`
(tests/test_tag_contract.py checks it). Tag names are stable: they are the
users' TensorBoard layout.

>>> MOMENT_NAMES[0], io_names({"b": 1, "a": 2}, "input"), io_names([1, 2], "output", ["y", "z"])
('norm', ['a', 'b'], ['y', 'z'])
>>> describe_tag("grad_norm/dense_1")
'kgrad: L2 norm of dJ/d(output of layer `dense_1`)'
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
#: ``instruments=["per_example"]``: per weight, ``example_grad_norm_<stat>/<weight path>``.
EXAMPLE_NORM_STATS = ("mean", "max")
#: ``instruments=["per_example"]``: the sums of the gradient noise scale, per layer
#: (``<kind>/<layer>``) and over the model (``global/<kind>``).
NOISE_KINDS = ("noise_example_sq_norm_mean", "noise_batch_sq_norm")

#: Tensors summarized by every moment and a histogram: scalar tags
#: ``<kind>_<stat>/<name>`` (``<stat>`` in `MOMENT_NAMES`), histograms ``<kind>_hist/<name>``.
TENSOR_KINDS = {
    "activation": "the output of layer `{name}`",
    "grad": "dJ/d(output of layer `{name}`)",
    "pred_grad": "dJ/dŷ for output `{name}`",
    "input_grad": "dJ/dx for input `{name}`",
    "weight_grad": "dJ/dw for weight `{name}`",
}
#: How a description names each ``<stat>`` of a tensor kind.
STAT_WORDS = {
    "norm": "L2 norm of",
    "mean": "mean of",
    "std": "standard deviation of",
    "min": "min of",
    "max": "max of",
    "zero_fraction": "fraction of zeros in",
    "nonfinite": "count of NaN/Inf in",
    "hist": "histogram of",
}
_LOGIT_WORDS = {"logit_max": "max logit", "logit_lse": "log-sum-exp of the logits",
                "logit_entropy": "entropy of softmax(logits)", "logit_top1_prob": "top-1 probability"}
#: Every other per-name prefix (``<prefix>/<name>``), and what it measures.
PREFIXES = {
    "weight_norm": "‖w‖ of weight `{name}` before the update",
    "update_ratio": "‖Δw‖ / ‖w‖ of weight `{name}` in the probed step",
    "pred_grad_example_norm_mean": "mean over the batch of per-example ‖dJ/dŷ‖, output `{name}`",
    "pred_grad_example_norm_max": "max over the batch of per-example ‖dJ/dŷ‖, output `{name}`",
    "adam_rms": "RMS of g/(√v̂+ε) of weight `{name}`: the gradient in the units of Adam's second moment",
    "grad_outlier_fraction": "fraction of the entries of dJ/dw of `{name}` beyond k·σ of Adam's moments",
    "update_rms": "RMS of Δw of weight `{name}` in the probed step",
    **{f"{kind}_{stat}": f"{stat} over examples and positions of the {what} of output `{{name}}`"
       for kind, what in _LOGIT_WORDS.items() for stat in ("mean", "max")},
    "attention_logit_max": "largest pre-softmax score (scaled q·k) of attention head `{name}`",
    "attention_entropy": "mean entropy (nats) of the attention weights of head `{name}`",
    **{f"example_grad_norm_{stat}": f"{stat} over the batch of per-example ‖dJ/dw‖ of weight `{{name}}`"
       for stat in EXAMPLE_NORM_STATS},
    "example_grad_norm_hist": "histogram of per-example ‖dJ/dw‖ of weight `{name}`",
    "noise_example_sq_norm_mean": "mean over examples of |G_i|², layer `{name}` (gradient noise scale)",
    "noise_batch_sq_norm": "|G_B|², the batch gradient's squared norm, layer `{name}` (gradient noise scale)",
    # NonFiniteGuard(skip_spikes=True): every step, and per weight for each skipped step.
    "spike_window_mean": "mean of `{name}` (ln of the loss or of the global gradient norm) over the "
                         "guard's spike window, the last N accepted steps",
    "spike_window_std": "σ (n − 1) of `{name}` (ln of the loss or of the global gradient norm) over "
                        "the guard's spike window",
    "skip_grad_norm": "‖dJ/dw‖ of weight `{name}` in a step the guard skipped for a spike",
    "skip_update_ratio": "‖Δw‖ / ‖w‖ that a skipped step would have made to weight `{name}`",
    "skip_cos_grad_weight": "cos(dJ/dw, w) of weight `{name}` in a skipped step",
    "skip_adam_rms": "RMS of g/(√v̂+ε) of weight `{name}` in a skipped step (Adam's moments)",
    "skip_z_grad_norm": "z-score of ‖dJ/dw‖ of weight `{name}` in a skipped step, against the "
                        "guard's window of accepted steps",
    **{f"skip_z_{value}": f"z-score of the {what} of weight `{{name}}` in a skipped step, against the "
                          "samples of the applied update (one every spike_sample_every steps)"
       for value, what in (("update_ratio", "‖Δw‖ / ‖w‖"), ("cos_grad_weight", "cos(dJ/dw, w)"),
                           ("adam_rms", "adam_rms"))},
}
#: The folder of the tags that are of the whole model, not of a name.
GLOBAL_PREFIX = "global/"
#: Tags under `GLOBAL_PREFIX`, one by one.
GLOBAL_TAGS = {
    GRAD_NORM_TAG: "‖dJ/dw‖ over all trainable weights",
    LOSS_TAG: "the loss of the probed step (unscaled, of the global batch)",
    "global/loss_scale": "loss scale of the LossScaleOptimizer in the probed step",
    "global/loss_scale_skipped": "1 if the loss scaler skipped the update "
                                 "(its scaled gradients overflowed), else 0",
    "global/noise_example_sq_norm_mean": "mean over examples of |G_i|² over the model (gradient noise scale)",
    "global/noise_batch_sq_norm": "|G_B|² over the model (gradient noise scale)",
    "global/batch_size": "examples in the probed batch (of the per-example instrument)",
    "global/step_skipped": "1 if NonFiniteGuard(skip_spikes=True) skipped the step's update, else 0",
    "global/spike_score": "the step's largest (ln x − mean)/σ over its loss and global gradient "
                          "norm, against the guard's spike window of logarithms (absent where it "
                          "cannot be computed: see kgrad report)",
}
#: Text tags: a tripped `kgrad.NonFiniteGuard`'s report (JSON), at the bad step.
GUARD_REPORT_TAG = "guard/report"


def tag_prefixes():
    """Every tag kgrad writes, as ``<prefix>/`` (before a name) or as the whole tag (``global/``, ``guard/``).

    >>> prefixes = tag_prefixes()
    >>> "grad_norm/" in prefixes, "weight_grad_hist/" in prefixes, "global/loss" in prefixes
    (True, True, True)
    """
    tensor_prefixes = [f"{kind}_{stat}/" for kind in TENSOR_KINDS for stat in (*MOMENT_NAMES, "hist")]
    return tensor_prefixes + [f"{prefix}/" for prefix in PREFIXES] + [*GLOBAL_TAGS, GUARD_REPORT_TAG]


def describe_tag(tag):
    """A one-line description of a kgrad tag, for TensorBoard's tooltips (``"kgrad"`` for an unknown one).

    >>> describe_tag("update_ratio/dense/kernel")
    'kgrad: ‖Δw‖ / ‖w‖ of weight `dense/kernel` in the probed step'
    """
    if tag in GLOBAL_TAGS:
        return "kgrad: " + GLOBAL_TAGS[tag]
    prefix, _, name = tag.partition("/")
    if prefix in PREFIXES:
        return "kgrad: " + PREFIXES[prefix].format(name=name)
    for kind, what in TENSOR_KINDS.items():
        stat = prefix[len(kind) + 1 :]
        if prefix.startswith(kind + "_") and stat in STAT_WORDS:
            return f"kgrad: {STAT_WORDS[stat]} {what.format(name=name)}"
    return "kgrad"
