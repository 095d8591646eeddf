"""The spike rule's device state on JAX: one float buffer and one int vector, whatever its fields.

Every array a jitted step takes and gives back costs the step something of
its own: JAX dispatches each input, XLA allocates and writes each output. The
rule's twelve arrays cost the benchmark transformer's guarded step (1.35
CPU-ms on 2 cores) about 0.17 CPU-ms, where the rule's arithmetic is about
3 µs (a ``fori_loop`` of the same code). Packed in two arrays, the float
buffer donated to the next step (`kgrad.backends.jax.guard.run.GuardRun`),
the same rule called alone went from 75 to 21 µs a call.

`SpikeRecord` keeps the names the rule's code reads and writes
(``record.window``, ``record._replace(accepted=...)``, as the named tuple it
was): each is a view of its slice of the buffer, or one entry of the int
vector (``tripped`` and ``news`` are booleans there).

Example:

>>> import jax.numpy as jnp
>>> record = SpikeRecord.zeros({"window": (4, 3), "rows": (2, 7)}, skip_slots=2)
>>> record = record._replace(accepted=jnp.int32(5), tripped=jnp.asarray(True))
>>> int(record.accepted), bool(record.tripped), record.window.shape, record.skip_steps.tolist()
(5, True, (4, 3), [-1, -1])
>>> record.with_row("rows", 1, jnp.arange(7.0)).rows[1].tolist()
[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
"""

import math
import typing

import jax
import jax.numpy as jnp

#: The float fields, in the buffer's order (each a 2- or 3-dimensional array).
FLOAT_FIELDS = ("window", "rows", "skip_values", "samples")

#: The int vector's scalars, in order; ``skip_steps`` (one per skip slot) follows them.
COUNTERS = ("accepted", "streak", "tripped", "news", "row_count", "skip_count", "sample_count")

_BOOLEANS = frozenset({"tripped", "news"})

#: Where the count of skipped steps is in the int vector (read on the host, `SpikeReads.news`).
SKIP_COUNT = COUNTERS.index("skip_count")


class Layout(typing.NamedTuple):
    """Where each field lies: the float fields' shapes (`FLOAT_FIELDS` order), the skip slots."""

    shapes: tuple
    skip_slots: int

    def span(self, field):
        """``(start, size)`` of ``field`` in the float buffer."""
        start = 0
        for name, shape in zip(FLOAT_FIELDS, self.shapes):
            size = math.prod(shape)
            if name == field:
                return start, size
            start += size
        raise KeyError(field)


@jax.tree_util.register_pytree_node_class
class SpikeRecord:
    """The spike rule's device arrays (`kgrad.backends.tensorflow.guard.spikes.SpikeState`'s variables).

    Args:
        layout: The `Layout` (static: part of the jitted step's signature).
        values: The float buffer: `FLOAT_FIELDS`, each flattened, one after the other.
        counts: The int32 vector: `COUNTERS`, then ``skip_steps``.
    """

    __slots__ = ("layout", "values", "counts")

    def __init__(self, layout, values, counts):
        self.layout, self.values, self.counts = layout, values, counts

    @classmethod
    def zeros(cls, shapes, skip_slots):
        """The record before any step: ``shapes`` maps each float field to its shape (missing: empty)."""
        shapes = tuple(tuple(shapes.get(name, (0, 0))) for name in FLOAT_FIELDS)
        layout = Layout(shapes, skip_slots)
        values = jnp.zeros((sum(math.prod(shape) for shape in shapes),), jnp.float32)
        counts = jnp.concatenate([
            jnp.zeros((len(COUNTERS),), jnp.int32), jnp.full((skip_slots,), -1, jnp.int32),
        ])
        return cls(layout, values, counts)

    def tree_flatten(self):
        return (self.values, self.counts), self.layout

    @classmethod
    def tree_unflatten(cls, layout, children):
        return cls(layout, *children)

    def __getattr__(self, name):
        if name in FLOAT_FIELDS:
            start, size = self.layout.span(name)
            return self.values[start : start + size].reshape(self.layout.shapes[FLOAT_FIELDS.index(name)])
        if name in COUNTERS:
            value = self.counts[COUNTERS.index(name)]
            return value > 0 if name in _BOOLEANS else value
        if name == "skip_steps":
            return self.counts[len(COUNTERS) :]
        raise AttributeError(name)

    def _replace(self, **changes):
        """The record with ``changes`` (field name: new value), as a named tuple's ``_replace``."""
        values, counts = self.values, self.counts
        for name in FLOAT_FIELDS:
            if name in changes:
                start, _ = self.layout.span(name)
                flat = jnp.reshape(changes[name], (-1,)).astype(jnp.float32)
                values = jax.lax.dynamic_update_slice(values, flat, (start,))
        if any(name in changes for name in (*COUNTERS, "skip_steps")):
            scalars = [jnp.asarray(changes[name] if name in changes else getattr(self, name))
                       for name in COUNTERS]
            scalars = [scalar.astype(jnp.int32) for scalar in scalars]
            steps = changes.get("skip_steps", self.skip_steps)
            counts = jnp.concatenate([jnp.stack(scalars), jnp.asarray(steps, jnp.int32)])
        return SpikeRecord(self.layout, values, counts)

    def with_row(self, field, index, row):
        """The record with row ``index`` (traced) of ``field`` set to ``row``, written in place."""
        start, _ = self.layout.span(field)
        shape = self.layout.shapes[FLOAT_FIELDS.index(field)]
        width = math.prod(shape[1:])
        flat = jnp.reshape(row, (-1,)).astype(jnp.float32)
        offset = start + (index % shape[0]) * width
        values = jax.lax.dynamic_update_slice(self.values, flat, (offset,))
        return SpikeRecord(self.layout, values, self.counts)

    def without_values(self):
        """The record without its float buffer (`split_values`)."""
        return SpikeRecord(self.layout, None, self.counts)

    def __repr__(self):
        return f"SpikeRecord(layout={self.layout}, values={self.values!r}, counts={self.counts!r})"


def split_values(spikes):
    """``(float buffers, spikes without them)`` of ``spikes``: ``None``, a record, or a tuple of records.

    The float buffers are what a step donates to the next (`joined` puts them back).
    """
    records = spikes if isinstance(spikes, tuple) else (spikes,)
    buffers = tuple(record.values for record in records if record is not None)
    rest = tuple(None if record is None else record.without_values() for record in records)
    return buffers, rest if isinstance(spikes, tuple) else rest[0]


def joined(rest, buffers):
    """The ``spikes`` that `split_values` split into ``buffers`` and ``rest``."""
    records = rest if isinstance(rest, tuple) else (rest,)
    remaining = iter(buffers)
    whole = tuple(None if record is None else SpikeRecord(record.layout, next(remaining), record.counts)
                  for record in records)
    return whole if isinstance(rest, tuple) else whole[0]
