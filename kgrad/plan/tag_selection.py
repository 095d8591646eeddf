"""Which tags a probe writes: ``statistics="default"`` or ``"all"``.

`kgrad.plan.options.STATISTICS`; the tag scheme is in `summarize.summaries`. ``"all"``
writes every tag of the scheme. ``"default"`` writes what the report, the
dashboard and people read (58 scalar and 20 histogram tags for the demo's
9-layer MLP, against 306 and 38):

- ``grad_norm/``, ``grad_nonfinite/`` and ``grad_hist/`` of every layer: the
  gradient flow, and its NaN/Inf (a NaN born in the forward pass makes the
  loss and so every gradient NaN: these counts see it too);
- ``activation_zero_fraction/`` (dead units);
- ``weight_grad_norm/``, ``weight_grad_hist/``, ``weight_norm/`` and
  ``update_ratio/`` of every weight with two or more dimensions (kernels,
  embeddings; not biases); of a layer with no such weight (a
  BatchNormalization's or LayerNormalization's gamma and beta), its weights'
  ``weight_grad_norm/``, ``weight_norm/`` and ``update_ratio/``, without
  histograms, so that every layer with weights has a dJ/dw;
- ``input_grad_norm/``, ``input_grad_hist/``, ``pred_grad_norm/``,
  ``pred_grad_hist/`` and ``global/*``;
- with ``instruments=["per_example"]``, ``example_grad_norm_mean/``,
  ``example_grad_norm_max/`` and ``example_grad_norm_hist/`` of every
  weight, and every ``noise_*`` sum.

Tags of other kinds (e.g. the noise sums of the instruments) are all written. The values
of the tags written are the same under both settings.

Each backend's summary builder drops the rows that are not written before
they enter its scalars and histograms (histograms not written are not
computed, nor the moments of a tensor of which only the norm is written);
`weight_tags_written` says of which weights a step computes ``weight_norm/``
and ``update_ratio/`` at all.
"""

from kgrad.plan.tag_names import MOMENT_NAMES

#: Under ``statistics="default"``: the moments each kind of tensor writes.
#: Kinds not listed write all of them.
DEFAULT_MOMENTS = {
    "activation": ("zero_fraction",),
    "grad": ("norm", "nonfinite"),
    "pred_grad": ("norm",),
    "input_grad": ("norm",),
    "weight_grad": ("norm",),
    # Per-example gradient norms: their spread over the batch (the noise
    # scale comes from its own sums, written whatever the setting).
    "example_grad_norm": ("mean", "max"),
}
#: Under ``statistics="default"``: the kinds whose histograms are written
#: (the gradients'; kinds not in `DEFAULT_MOMENTS` keep theirs too).
DEFAULT_HISTOGRAMS = ("grad", "pred_grad", "input_grad", "weight_grad", "example_grad_norm")
#: Under ``statistics="default"``: scalar tags (prefixes) left out.
DEFAULT_DROPPED_SCALARS = ("pred_grad_example_norm_mean/", "pred_grad_example_norm_max/")
#: Every column of a row of moments.
ALL_MOMENTS = tuple(range(len(MOMENT_NAMES)))


def selected(statistics, kind, tensor, layer_has_a_matrix=True):
    """``(moment columns, histogram?)`` that ``statistics`` writes for a tensor.

    ``layer_has_a_matrix``: for a weight's gradient, whether the weight's
    layer has a weight of two or more dimensions (see `layers_with_a_matrix`).
    """
    if statistics == "all" or kind not in DEFAULT_MOMENTS:
        return ALL_MOMENTS, True
    rank = _rank(tensor)
    if kind == "weight_grad" and rank is not None and rank < 2:
        if not layer_has_a_matrix:
            # A normalization layer's gamma and beta are all the dJ/dw it has:
            # their norms give its row in the report and the tab.
            return (MOMENT_NAMES.index("norm"),), False
        # Biases: ~half of a model's weights, and not what a gradient-flow
        # view shows (their layer's kernel is).
        return (), False
    columns = tuple(MOMENT_NAMES.index(stat) for stat in DEFAULT_MOMENTS[kind])
    return columns, kind in DEFAULT_HISTOGRAMS


def _rank(tensor):
    """The number of dimensions of a TensorFlow tensor (``None`` if unknown) or a JAX array."""
    shape = tensor.shape
    return len(shape) if isinstance(shape, tuple) else shape.rank


def scalar_selected(statistics, tag):
    """Whether ``statistics`` writes the scalar ``tag`` given to `SummaryBuilder.add_scalar`."""
    return statistics == "all" or not tag.startswith(DEFAULT_DROPPED_SCALARS)


def weight_tags_written(statistics, gradient, layer_has_a_matrix=True):
    """Whether ``statistics`` writes ``weight_norm/`` and ``update_ratio/`` of a weight.

    Under ``"all"``, of every weight; under ``"default"``, of the weights
    whose ``weight_grad_norm/`` is written (``gradient`` is not ``None`` and
    has two or more dimensions, or its layer has no such weight): a bias's
    norm and update are not read.

    Example:

    >>> import tensorflow as tf
    >>> weight_tags_written("default", tf.zeros([3])), weight_tags_written("all", None)
    (False, True)
    >>> weight_tags_written("default", tf.zeros([3]), layer_has_a_matrix=False)
    True
    """
    if statistics == "all":
        return True
    return gradient is not None and bool(selected(statistics, "weight_grad", gradient, layer_has_a_matrix)[0])


def layers_with_a_matrix(paths, shapes):
    """The layer paths (a weight's path less its last part) that own a weight of two or more dimensions.

    Example:

    >>> sorted(layers_with_a_matrix(["dense/kernel", "dense/bias", "bn/gamma"], [(3, 2), (2,), (2,)]))
    ['dense']
    """
    return {
        path.rpartition("/")[0]
        for path, shape in zip(paths, shapes)
        if shape is not None and len(shape) >= 2
    }
