"""Named summaries of a probed step, computed on device, under the tags of `kgrad.plan.tag_names`.

The tags are the contract of `kgrad.plan.tag_names` (the users' table is
docs/tags.md); which of them are written depends on ``statistics=``
(`kgrad.plan.tag_selection`).
"""

import tensorflow as tf

from kgrad.plan.tag_names import MOMENT_NAMES
from kgrad.backends.tensorflow.summarize import norms, stats
from kgrad.plan.options import check_statistics
from kgrad.plan.tag_selection import scalar_selected, selected


_NORM = MOMENT_NAMES.index("norm")


class SummaryBuilder:
    """Accumulates named on-device summaries in a fixed order.

    Tensors are summarized together when the scalars or histograms are
    first asked for (`kgrad.backends.tensorflow.summarize.stats.summarize_many`: straight-line kernels per
    tensor, one branch for all of them; with ``statistics="default"``, one
    call for the tensors with a histogram, one for the others, and
    `kgrad.backends.tensorflow.summarize.norms.norms_many` for those of which only the norm is written).

    Args:
        histograms: Whether tensors also get a histogram.
        bucket_count: Buckets per histogram.
        statistics: Which tags are written (`kgrad.plan.options.STATISTICS`, see the
            module docstring; a probe passes its ``ProbeConfig.statistics``).
            Rows not written never enter `scalars` or `histograms`, so they
            are neither buffered nor read by the host.
    """

    def __init__(self, histograms, bucket_count, statistics="all"):
        check_statistics(statistics)
        self._histograms = histograms
        self._bucket_count = bucket_count
        self._statistics = statistics
        self.scalar_names = []
        # In name order, what `scalars()` concatenates: (tensor index, moment
        # columns), a [k] tensor, or fn(moments, tensors) -> scalar.
        self._scalar_blocks = []
        self._scalar_sizes = []  # scalars per block
        self.histogram_names = []
        self._histogram_indices = []  # tensors with a histogram, in name order
        self._norm_only = set()  # tensors of which at most the norm is written
        self._tensors = []
        self._summaries = None

    def add_tensor(self, kind, name, tensor, layer_has_a_matrix=True):
        """Moments of ``tensor`` under ``<kind>_<stat>/<name>``, and its histogram.

        ``layer_has_a_matrix``: see `kgrad.plan.tag_selection.selected`.

        Returns the tensor's index: its row in the ``[n, 7]`` moments, and its
        place in the tensors, that a callable given to `add_scalar` receives
        (whether or not its own rows are written).
        """
        self._check_open()
        index = len(self._tensors)
        self._tensors.append(tensor)
        columns, histogram = selected(self._statistics, kind, tensor, layer_has_a_matrix)
        if columns:
            self.scalar_names += [f"{kind}_{MOMENT_NAMES[column]}/{name}" for column in columns]
            self._scalar_blocks.append((index, columns))
            self._scalar_sizes.append(len(columns))
        if self._histograms and histogram:
            self.histogram_names.append(f"{kind}_hist/{name}")
            self._histogram_indices.append(index)
        elif set(columns) <= {_NORM}:
            self._norm_only.add(index)
        return index

    def add_scalar(self, tag, value):
        """A scalar tensor, or ``fn(moments, tensors) -> scalar``.

        ``moments`` are the ``[n, 7]`` moments of the added tensors, and
        ``tensors`` the tensors themselves, in `add_tensor` order: a callable
        reads them from its arguments, not from its closure, so that it also
        works on the tensors of `with_inputs`. The row of a tensor of which
        at most the norm is written (no histogram; see
        `kgrad.plan.tag_selection.selected`) holds only its norm, NaN elsewhere:
        of those, a callable reads the norm.
        """
        self._check_open()
        if not scalar_selected(self._statistics, tag):
            return
        self.scalar_names.append(tag)
        self._scalar_sizes.append(1)
        if callable(value):
            self._scalar_blocks.append(value)
        else:
            self._scalar_blocks.append(tf.reshape(tf.cast(value, tf.float32), [1]))

    def add_scalars(self, tags, values):
        """Scalars given as one ``[len(tags)]`` vector, in ``tags`` order."""
        self._check_open()
        tags = list(tags)
        values = tf.reshape(tf.cast(values, tf.float32), [len(tags)])
        kept = [index for index, tag in enumerate(tags) if scalar_selected(self._statistics, tag)]
        if not kept:
            return
        if len(kept) < len(tags):
            tags, values = [tags[index] for index in kept], tf.gather(values, kept)
        self.scalar_names += tags
        self._scalar_blocks.append(values)
        self._scalar_sizes.append(len(tags))

    def inputs(self):
        """Every tensor the summaries are computed from, as one flat list.

        The added tensors, then the scalar tensors, in the order they were
        added. A function can return them and another, traced apart (outside
        XLA, after the step), summarize them with `with_inputs`.
        """
        return list(self._tensors) + [
            block for block in self._scalar_blocks if tf.is_tensor(block)
        ]

    def with_inputs(self, inputs):
        """A builder with the same names and scalars, summarizing ``inputs``.

        Args:
            inputs: What `inputs` returned, or tensors of the same structure
                (in another graph).

        Example:

        >>> import tensorflow as tf
        >>> from kgrad.backends.tensorflow.summarize.summaries import SummaryBuilder
        >>> builder = SummaryBuilder(histograms=False, bucket_count=1, statistics="default")
        >>> _ = builder.add_tensor("activation", "dense", tf.constant([3.0, 4.0]))
        >>> builder.add_scalar("global/norm", lambda moments, tensors: moments[0, 0])
        >>> later = builder.with_inputs([tf.constant([6.0, 8.0])])
        >>> later.scalar_names, float(later.scalars()[-1])
        (['activation_zero_fraction/dense', 'global/norm'], 10.0)
        """
        inputs = list(inputs)
        expected = len(self.inputs())
        if len(inputs) != expected:
            raise ValueError(
                f"SummaryBuilder.with_inputs: expected the {expected} tensors that "
                f"inputs() returns, received {len(inputs)}."
            )
        other = SummaryBuilder(self._histograms, self._bucket_count, self._statistics)
        other.scalar_names = list(self.scalar_names)
        other.histogram_names = list(self.histogram_names)
        other._histogram_indices = list(self._histogram_indices)
        other._norm_only = set(self._norm_only)
        other._scalar_sizes = list(self._scalar_sizes)
        other._tensors = inputs[: len(self._tensors)]
        scalar_tensors = iter(inputs[len(self._tensors) :])
        other._scalar_blocks = [
            next(scalar_tensors) if tf.is_tensor(block) else block for block in self._scalar_blocks
        ]
        return other

    def _check_open(self):
        if self._summaries is not None:
            raise RuntimeError("SummaryBuilder: add summaries before reading scalars() or histograms().")

    def _summarize(self):
        if self._summaries is None:
            self._summaries = self._summarize_tensors()
        return self._summaries

    def _summarize_tensors(self):
        """``(moments [n, 7], histograms [len(histogram_names), k, 3] or None)``."""
        tensors, with_histogram = self._tensors, self._histogram_indices
        # Histograms are most of a probed step's cost: only the written ones
        # are computed. A tensor of which only the norm is written (a bias's
        # gradient, for the global norm; a kernel's without its histogram)
        # gets one kernel, not five (`kgrad.backends.tensorflow.summarize.norms.norms_many`). Per tensor,
        # the values are those of a single call.
        norm_only = [index for index in range(len(tensors)) if index in self._norm_only]
        apart = set(with_histogram) | self._norm_only
        others = [index for index in range(len(tensors)) if index not in apart]
        parts, histograms = [], None
        if with_histogram:
            moments, histograms = stats.summarize_many(
                [tensors[index] for index in with_histogram], self._bucket_count
            )
            parts.append(moments)
        if others:
            parts.append(stats.summarize_many([tensors[index] for index in others])[0])
        if norm_only:
            parts.append(_norm_rows(norms.norms_many([tensors[index] for index in norm_only])))
        if len(parts) == 1:
            return parts[0], histograms
        position = {index: place for place, index in enumerate(with_histogram + others + norm_only)}
        order = [position[index] for index in range(len(tensors))]
        return tf.gather(tf.concat(parts, axis=0), order), histograms

    def scalars(self):
        """All scalars as one ``[n]`` float32 vector, in ``scalar_names`` order.

        The moments written are taken by one gather, whatever the number of
        tensors, then put in name order with the other scalars by another:
        no op per tensor.
        """
        if not self._scalar_blocks:
            return tf.zeros([0])
        moments = self._summarize()[0]
        width = len(MOMENT_NAMES)
        moment_entries, others, other_count = [], [], 0
        places = []  # per name: ("moment" or "other", its place among those)
        for block, size in zip(self._scalar_blocks, self._scalar_sizes):
            if isinstance(block, tuple):
                index, columns = block
                places += [("moment", len(moment_entries) + place) for place in range(len(columns))]
                moment_entries += [index * width + column for column in columns]
                continue
            if callable(block):
                block = tf.cast(block(moments, self._tensors), tf.float32)
            others.append(tf.reshape(block, [size]))
            places += [("other", other_count + place) for place in range(size)]
            other_count += size
        parts = [tf.gather(tf.reshape(moments, [-1]), moment_entries)] if moment_entries else []
        joined = tf.concat(parts + others, axis=0) if len(parts + others) > 1 else (parts + others)[0]
        taken = len(moment_entries)
        order = [place if kind == "moment" else taken + place for kind, place in places]
        if order == list(range(len(order))):
            return joined
        return tf.gather(joined, order)

    def histograms(self):
        """All histograms as one ``[n, buckets, 3]`` float32 tensor."""
        if not self.histogram_names:
            return tf.zeros([0, self._bucket_count, 3])
        return self._summarize()[1]


def _norm_rows(tensor_norms):
    """``[n, 7]`` rows of moments holding only ``tensor_norms``: NaN in the columns not computed."""
    missing = tf.fill([tf.shape(tensor_norms)[0], len(MOMENT_NAMES) - 1], float("nan"))
    return tf.concat([tensor_norms[:, tf.newaxis], missing], axis=1)
