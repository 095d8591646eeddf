"""The Custom Scalars dashboard's layout for a run of kgrad tags.

Charts that can be read: one category per quantity, at most `LAYERS_PER_CHART`
layers per chart, in forward order, each chart listing its tags exactly.
`kgrad.logs.writer.ProbeWriter` writes it once per event file.
"""

import re

from tensorboard.plugins.custom_scalar import layout_pb2

#: Categories of the custom-scalars dashboard: (tag prefix, what it shows),
#: each with one chart per group of at most `LAYERS_PER_CHART` layers or
#: weights, in the order the probe logged them (forward order).
LAYOUT_KINDS = (
    ("grad_norm/", "dJ/d(activation) norm"),
    ("weight_grad_norm/", "dJ/dw norm"),
    ("update_ratio/", "update ratio ‖Δw‖/‖w‖"),
    ("activation_zero_fraction/", "fraction of zero activations"),
    ("activation_norm/", "activation norm"),
)
#: Most lines on one chart, per run: more cannot be told apart.
LAYERS_PER_CHART = 8
# Whole-model tags, on one chart of their own.
_MODEL_REGEX = r"(global/grad_norm|pred_grad_norm/.*|input_grad_norm/.*)$"
# TensorBoard 2.21's layout has no y-axis scale (MultilineChartContent holds
# only `tag`): each chart's "Toggle y-axis log scale" button turns it on.
_NOTE = "every layer on one log scale: the kgrad tab; log y here: each chart's line-weight button"


def custom_scalar_layout(scalar_tags):
    """The custom-scalars dashboard layout for a run with these scalar tags.

    One category per quantity of `LAYOUT_KINDS`, with charts of at most
    `LAYERS_PER_CHART` layers each (in the tags' order), then one chart of
    the whole-model norms and one of the non-finite counts. Each chart lists
    its tags exactly, so that it shows only them.

    Example:

    >>> from kgrad.logs.layout import custom_scalar_layout
    >>> tags = [f"grad_norm/dense_{i}" for i in range(10)]
    >>> layout = custom_scalar_layout(tags)
    >>> [chart.title for chart in layout.category[0].chart]
    ['dJ/d(activation) norm: dense_0 … dense_4', 'dJ/d(activation) norm: dense_5 … dense_9']
    """
    scalar_tags = list(scalar_tags)
    categories = []
    for prefix, title in LAYOUT_KINDS:
        names = [tag[len(prefix) :] for tag in scalar_tags if tag.startswith(prefix)]
        charts = [_chart(title, prefix, group) for group in _groups(names)]
        if charts:
            categories.append(layout_pb2.Category(title=f"kgrad: {title}", chart=charts))
    model_chart = layout_pb2.Chart(
        title="‖dJ/dw‖ of all weights, dJ/dŷ and dJ/dx norms",
        multiline=layout_pb2.MultilineChartContent(tag=[_MODEL_REGEX]),
    )
    health = [tag for tag in scalar_tags if tag.partition("/")[0].endswith("_nonfinite")]
    health_charts = [_chart("NaN/Inf count", "", group) for group in _groups(health)]
    categories.append(
        layout_pb2.Category(title="kgrad: whole model, NaN/Inf counts", chart=[model_chart] + health_charts)
    )
    if categories:
        # The note goes where the eye lands first, in the first category's title.
        categories[0].title += f" ({_NOTE})"
    return layout_pb2.Layout(category=categories)


def _groups(names):
    """``names`` cut into about equal groups of at most `LAYERS_PER_CHART`."""
    if not names:
        return []
    count = -(-len(names) // LAYERS_PER_CHART)
    size = -(-len(names) // count)
    return [names[start : start + size] for start in range(0, len(names), size)]


def _chart(title, prefix, names):
    shown = f"{names[0]} … {names[-1]}" if len(names) > 1 else names[0]
    return layout_pb2.Chart(
        title=f"{title}: {shown}",
        multiline=layout_pb2.MultilineChartContent(tag=[_exact([prefix + name for name in names])]),
    )


def _exact(tags):
    """A regex that matches exactly ``tags`` (TensorBoard matches at the start)."""
    return "(" + "|".join(re.escape(tag) for tag in tags) + ")$"
