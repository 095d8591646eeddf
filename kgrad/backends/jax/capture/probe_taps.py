"""The probe's listener of the instrumented pass: statistics of the tapped outputs and their gradients.

`ProbeTaps` is what a `kgrad.GradientProbe` captures in one pass
(`kgrad.backends.jax.capture.instrumented`): the moments and histogram of
each selected layer's output (``activation_*``), and, through a carrier, of
dJ/d(output) (``grad_*``), dJ/dx (``input_grad_*``) and dJ/dŷ
(``pred_grad_*``, with the mean and max of its per-example norms).
`add_weight_rows` adds the weights' rows once the optimizer has applied the
gradients. Every probed part (`kgrad.backends.jax.own_step.part`), Keras' own
step's one part included, uses them.
"""

import jax.numpy as jnp

from kgrad.backends.common import norms
from kgrad.backends.jax.capture.carriers import CarrierLayout, tap_gradient
from kgrad.backends.jax.capture.instrumented import Listener
from kgrad.backends.jax.summarize import stats
from kgrad.backends.jax.summarize.compiled import compiled_on_its_own
from kgrad.backends.jax.summarize.update_norms import update_ratio, weight_and_change_norms
from kgrad.plan.tag_names import GRAD_NORM_TAG
from kgrad.plan.tag_selection import layers_with_a_matrix, weight_tags_written

#: The summary kind of each tap's gradient, and the capture option it needs.
GRADIENT_KIND = {
    "activation": ("grad", "activation_gradients"),
    "input": ("input_grad", "input_gradient"),
    "prediction": ("pred_grad", "prediction_gradient"),
}


class ProbeTaps(Listener):
    """The probe's statistics of one pass, added to ``rows`` by `add_rows`.

    Args:
        config: The `kgrad.plan.options.ProbeConfig`.
        rows: The step's `kgrad.backends.jax.summarize.summaries.SummaryRows`.
        selection: ``(operations by name, keep)`` of the captured layers.
        inverse_scale: 1 / the loss scale when the differentiated loss was scaled
            (mixed precision), else ``None``: the statistics are of the true loss.

    Attributes:
        found: ``{key: (kind, shape)}`` of its taps, once discovered.
    """

    def __init__(self, config, rows, selection, inverse_scale=None):
        self.config, self.rows, self.selection = config, rows, selection
        self.inverse_scale = inverse_scale
        self.found, self._layouts = {}, {}

    @property
    def _buckets(self):
        return self.config.bucket_count if self.config.histograms else None

    def discovered(self, found, trace):
        self.found = found
        for key, (kind, shape) in found.items():
            gradient_kind, option = GRADIENT_KIND[kind]
            if self.config.captures(option):
                wants = self.rows.wants_histogram(gradient_kind, shape)
                self._layouts[key] = CarrierLayout(
                    self._buckets if wants else None,
                    example_norms=kind == "prediction",
                    columns=self.rows.columns(gradient_kind, shape),
                )
        return {key: layout.zeros() for key, layout in self._layouts.items()}

    def tap(self, key, kind, tensor, carriers, forward):
        if kind == "activation" and self.config.captures("activations"):
            wants = self.rows.wants_histogram("activation", tensor.shape)
            columns = self.rows.columns("activation", tensor.shape)
            forward[key] = (tensor, self._buckets if wants else None, columns)
        if key in carriers:
            return tap_gradient(tensor, carriers[key], self._layouts[key], self.inverse_scale)
        return tensor

    def finish(self, forward):
        # The activations' statistics, behind one branch for all of them.
        return dict(zip(forward, stats.summarize_group(list(forward.values()))))

    def add_rows(self, forward, cotangents, input_names=(), output_names=()):
        """Adds the rows of the pass: activations, then the gradients in the order of the taps.

        ``input_names``, ``output_names``: the names of the input and prediction
        taps, in their order.
        """
        for key, (row, histogram) in forward.items():
            self.rows.add("activation", key, row, histogram, self.found[key][1])
        names = {"input": iter(input_names), "prediction": iter(output_names)}
        for key, (kind, shape) in self.found.items():
            if key not in self._layouts:
                continue
            name = next(names[kind]) if kind in names else key
            row, histogram, example = self._layouts[key].split(cotangents[key])
            self.rows.add(GRADIENT_KIND[kind][0], name, row, histogram, shape)
            if example is not None:
                self.rows.add_scalar(f"pred_grad_example_norm_mean/{name}", example[0])
                self.rows.add_scalar(f"pred_grad_example_norm_max/{name}", example[1])

    def keys_of(self, kind):
        """The keys of its taps of ``kind``, in order."""
        return [key for key, (found_kind, _) in self.found.items() if found_kind == kind]


def add_weight_rows(rows, config, paths, before, gradients, after, inverse_scale=None):
    """The weights' rows: gradient moments, ``weight_norm/``, ``update_ratio/`` and the global norm.

    Args:
        rows: The `kgrad.backends.jax.summarize.summaries.SummaryRows` to add to.
        config: The `kgrad.plan.options.ProbeConfig`.
        paths: The weights' paths.
        before, after: Their values before and after the update.
        gradients: Their gradients (of the scaled loss when ``inverse_scale`` is given).
        inverse_scale: 1 / the loss scale, or ``None``.

    Returns:
        ``{weight number: ‖Δw‖}`` of the weights given ``update_ratio/``, for
        ``update_rms/`` (`kgrad.backends.jax.summarize.instruments.add_optimizer_rows`).
    """
    buckets = config.bucket_count if config.histograms else None
    if inverse_scale is not None:  # the gradients of the true loss, not of the scaled one
        gradients = [gradient.astype(jnp.float32) * inverse_scale for gradient in gradients]
    with_a_matrix = layers_with_a_matrix(paths, [gradient.shape for gradient in gradients])
    matrices = [path.rpartition("/")[0] in with_a_matrix for path in paths]
    items = [
        # The norm of every weight's gradient enters global/grad_norm (column 0).
        (gradient, buckets if rows.wants_histogram("weight_grad", gradient.shape, has_matrix) else None,
         rows.columns("weight_grad", gradient.shape, has_matrix, extra=(0,)))
        for gradient, has_matrix in zip(gradients, matrices)
    ]
    gradient_norms, changes = [], {}
    # Behind one branch for every weight gradient (`stats.summarize_group`).
    for number, (path, weight, gradient, updated, has_matrix, (row, histogram)) in enumerate(zip(
        paths, before, gradients, after, matrices, stats.summarize_group(items)
    )):
        gradient_norms.append(row[0])
        rows.add("weight_grad", path, row, histogram, gradient.shape, has_matrix)
        if weight_tags_written(config.statistics, gradient, has_matrix):
            norm, changes[number] = weight_and_change_norms(weight, updated)
            rows.add_scalar(f"weight_norm/{path}", norm)
            rows.add_scalar(f"update_ratio/{path}", update_ratio(norm, changes[number]))
    rows.add_scalar(GRAD_NORM_TAG, _combined_norm(gradient_norms))
    return changes


_combined_norm = compiled_on_its_own(norms.combined_norm)
