"""dJ/d(output) of a layer without a buffer the size of its output: a carrier's cotangent holds its stats.

`tap_gradient` is an identity on ``x`` with a second input, a small zero
"carrier". Its backward pass passes dJ/dx through unchanged (the weight
gradients are those of the plain step) and gives the carrier, as cotangent,
the statistics of dJ/dx (`kgrad.backends.jax.summarize.stats`): differentiating
the loss with respect to the carriers, in the same single backward pass as the
weights, yields dJ/d(activation)'s moments and histogram, whose size is fixed
(``7 + 3 * bucket_count`` floats), whatever the activation's size. Flax's
``perturb`` gets dJ/d(activation) itself instead, at the cost of a buffer the
size of the activation.

Example:

>>> import jax, jax.numpy as jnp
>>> layout = CarrierLayout(bucket_count=None, example_norms=False)
>>> f = lambda c: jnp.sum(3.0 * tap_gradient(jnp.ones(4), c, layout))
>>> [round(float(v), 3) for v in jax.grad(f)(layout.zeros())]  # norm, mean, std, min, max, zeros, non-finite
[6.0, 3.0, 0.0, 3.0, 3.0, 0.0, 0.0]
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from kgrad.backends.common import norms
from kgrad.backends.jax.summarize import stats
from kgrad.backends.jax.summarize.compiled import compiled_on_its_own


@dataclasses.dataclass(frozen=True)
class CarrierLayout:
    """What a carrier holds: the moments row, then the histogram, then per-example norms' mean and max."""

    bucket_count: object  # buckets of the histogram, or None for none
    example_norms: bool  # whether the mean and max of per-example norms follow (dJ/dŷ)
    columns: tuple = stats.ALL_COLUMNS  # the moments computed (the others are NaN)

    @property
    def size(self):
        return stats.ROW + 3 * (self.bucket_count or 0) + (2 if self.example_norms else 0)

    def zeros(self):
        return jnp.zeros([self.size], jnp.float32)

    def split(self, carrier):
        """``(moments [7], histogram [k, 3] or None, (example norm mean, max) or None)``."""
        return _split(carrier, layout=self)

    def statistics_of(self, gradient):
        """The carrier's cotangent: the statistics of ``gradient`` in this layout."""
        return _statistics_of(gradient, layout=self)


# Compiled calls (`kgrad.backends.jax.summarize.compiled`): one program each in a step run op by op.
@compiled_on_its_own(static_argnames=("layout",))
def _split(carrier, layout):
    row, rest = carrier[: stats.ROW], carrier[stats.ROW :]
    histogram = None
    if layout.bucket_count:
        histogram = rest[: 3 * layout.bucket_count].reshape([layout.bucket_count, 3])
        rest = rest[3 * layout.bucket_count :]
    return row, histogram, (rest[0], rest[1]) if layout.example_norms else None


@compiled_on_its_own(static_argnames=("layout",))
def _statistics_of(gradient, layout):
    row, histogram = stats.summarize(gradient, layout.bucket_count, layout.columns)
    parts = [row] + ([] if histogram is None else [histogram.ravel()])
    if layout.example_norms:
        example = norms.example_norms(gradient) if gradient.ndim else jnp.abs(gradient)[None]
        parts.append(jnp.stack([jnp.mean(example), norms.nan_max(example)]).astype(jnp.float32))
    return jnp.concatenate(parts)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def tap_gradient(x, carrier, layout, inverse_scale=None):
    """``x`` unchanged; the carrier's gradient is `CarrierLayout.statistics_of` dJ/dx.

    ``inverse_scale`` (a scalar, or ``None``) multiplies dJ/dx before its
    statistics are taken: 1 / the loss scale when the differentiated loss was
    scaled (mixed precision), so that the statistics are of the true loss.
    dJ/dx itself passes on scaled, as Keras' step needs it.
    """
    del carrier, layout, inverse_scale
    return x


def _forward(x, carrier, layout, inverse_scale):
    del carrier, layout
    return x, inverse_scale


def _backward(layout, inverse_scale, gradient):
    unscaled = gradient if inverse_scale is None else gradient.astype(jnp.float32) * inverse_scale
    no_scale_gradient = None if inverse_scale is None else jnp.zeros_like(inverse_scale)
    return gradient, layout.statistics_of(unscaled), no_scale_gradient


tap_gradient.defvjp(_forward, _backward)
