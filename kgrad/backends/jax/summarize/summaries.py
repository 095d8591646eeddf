"""The named summaries of a probed JAX step: the tags TensorFlow's step writes, from rows computed on device.

The tag scheme and what ``statistics=`` writes are backend-free
(`kgrad.plan.tag_names`, `kgrad.plan.tag_selection`); this builder gets each
tensor's moments row and histogram already computed (in the forward pass, in
the carriers' backward pass, or after it) and keeps the written ones, in a
fixed order decided at trace time.
"""

import jax.numpy as jnp

from kgrad.plan.tag_names import MOMENT_NAMES
from kgrad.plan.tag_selection import scalar_selected, selected


class SummaryRows:
    """Scalars and histograms of one probed step, named while the step is traced.

    Args:
        histograms: Whether histograms are written.
        statistics: ``"default"`` or ``"all"`` (`kgrad.plan.options.STATISTICS`).

    Example:

    >>> import jax.numpy as jnp
    >>> rows = SummaryRows(histograms=False, statistics="default")
    >>> rows.add("grad", "dense", jnp.arange(7.0), None, shape=(2, 3))
    >>> rows.scalar_names, [float(v) for v in rows.scalars()]
    (['grad_norm/dense', 'grad_nonfinite/dense'], [0.0, 6.0])
    """

    def __init__(self, histograms, statistics):
        self._histograms = histograms
        self._statistics = statistics
        self.scalar_names, self._scalar_values = [], []
        self.histogram_names, self._histogram_values = [], []

    def columns(self, kind, shape, layer_has_a_matrix=True, extra=()):
        """The moment columns written for a tensor of ``kind`` (and ``extra`` ones needed anyway)."""
        written = selected(self._statistics, kind, _Shaped(shape), layer_has_a_matrix)[0]
        return tuple(sorted(set(written) | set(extra)))

    def wants_histogram(self, kind, shape, layer_has_a_matrix=True):
        """Whether the histogram of a tensor of ``kind`` is written (so worth computing)."""
        return self._histograms and selected(self._statistics, kind, _Shaped(shape), layer_has_a_matrix)[1]

    def add(self, kind, name, row, histogram, shape, layer_has_a_matrix=True):
        """The written moments of ``row`` (``[7]``) as ``<kind>_<stat>/<name>``; ``<kind>_hist/<name>``."""
        columns, with_histogram = selected(self._statistics, kind, _Shaped(shape), layer_has_a_matrix)
        for column in columns:
            self.scalar_names.append(f"{kind}_{MOMENT_NAMES[column]}/{name}")
            self._scalar_values.append(row[column])
        if self._histograms and with_histogram and histogram is not None:
            self.histogram_names.append(f"{kind}_hist/{name}")
            self._histogram_values.append(histogram)

    def add_scalar(self, tag, value):
        """A scalar under ``tag``, if ``statistics=`` writes it."""
        if scalar_selected(self._statistics, tag):
            self.scalar_names.append(tag)
            self._scalar_values.append(jnp.asarray(value, jnp.float32))

    def scalars(self):
        """The ``[n]`` float32 scalars, in `scalar_names` order."""
        if not self._scalar_values:
            return jnp.zeros([0], jnp.float32)
        return jnp.stack([jnp.asarray(value, jnp.float32) for value in self._scalar_values])

    def histograms(self, bucket_count):
        """The ``[m, bucket_count, 3]`` histograms, in `histogram_names` order."""
        if not self._histogram_values:
            return jnp.zeros([0, bucket_count, 3], jnp.float32)
        return jnp.stack(self._histogram_values)


class _Shaped:
    """What `kgrad.plan.tag_selection.selected` reads of a tensor: its shape."""

    def __init__(self, shape):
        self.shape = tuple(shape)
