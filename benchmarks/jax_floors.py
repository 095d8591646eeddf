"""The floors that benchmarks/jax_overhead.py measures kgrad on JAX against: steps doing part of kgrad's work.

- `perturbed_step`: Keras' step with zero perturbations on the default layers'
  outputs (Flax's ``perturb``): dJ/d(activation) at all, with or without its statistics.
- `guard_floor_step`: Keras' step whose update waits, in a ``lax.cond``, for the
  sums of squares of the loss and the gradients: any guard's least.
- `statistics_replaced_by_one_pass`: while a probed step is traced, kgrad's
  statistics are one max per tensor (the one-pass floor), or that and the
  histograms kgrad writes, at their cheapest (the histogram floor), or one sum
  per tensor (the read-once floor of issue 53); their
  numbers are wrong by design, for timing only.
"""

import contextlib

import jax
import jax.numpy as jnp
from keras.src.trainers.data_adapters import data_adapter_utils

from kgrad.backends.jax.capture.taps import Taps, intercept
from kgrad.backends.jax.summarize import stats
from kgrad.plan import selection


def perturbed_step(model, with_statistics):
    """Keras' train_step with zero perturbations on the default layers' outputs, in one backward pass."""
    operations, keep = selection.resolve_selection(model, None)

    def step(state, data):
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        shapes = {}

        def record(name, kind, tensor):
            if kind == "activation":
                shapes[name] = jax.ShapeDtypeStruct(tensor.shape, jnp.float32)
            return tensor

        def forward(trainable):
            with intercept(model, operations, Taps(record, keep)):
                return model.stateless_call(trainable, non_trainable, x, training=True)[0]

        jax.eval_shape(forward, trainable)
        perturbations = {name: jnp.zeros(shape.shape, shape.dtype) for name, shape in shapes.items()}

        def loss_fn(trainable, perturbations):
            def add(name, kind, tensor):
                return tensor + perturbations[name].astype(tensor.dtype) if name in perturbations else tensor

            with intercept(model, operations, Taps(add, keep)):
                return model.compute_loss_and_updates(
                    trainable,
                    non_trainable,
                    metrics_variables,
                    x,
                    y,
                    sample_weight,
                    training=True,
                    optimizer_variables=optimizer_variables,
                )

        (_, aux), (gradients, perturbed) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
            trainable, perturbations
        )
        unscaled_loss, y_pred, non_trainable, metrics_variables = aux
        trainable, optimizer_variables = model.optimizer.stateless_apply(
            optimizer_variables, gradients, trainable
        )
        logs, metrics_variables = model._update_metrics_variables(
            metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
        )
        if with_statistics:
            summaries = [stats.summarize(g, 30) for g in perturbed.values()]
            logs = {
                **logs,
                "_kgrad_bench": jnp.sum(jnp.stack([jnp.sum(r) + jnp.sum(h) for r, h in summaries])),
            }
        else:
            logs = {**logs, "_kgrad_bench": sum(jnp.sum(g) for g in perturbed.values())}
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)

    return step


def guard_floor_step(model):
    """Keras' train_step whose update waits, in a ``lax.cond``, for the sums of squares to be finite."""

    def step(state, data):
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        (_, aux), gradients = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)(
            trainable, non_trainable, metrics_variables, x, y, sample_weight,
            training=True, optimizer_variables=optimizer_variables,
        )
        unscaled_loss, y_pred, non_trainable, metrics_variables = aux
        squares = jnp.stack([jnp.sum(jnp.square(t)) for t in [unscaled_loss, *gradients]])

        def update(operands):
            return model.optimizer.stateless_apply(*operands)

        trainable, optimizer_variables = jax.lax.cond(
            jnp.all(jnp.isfinite(squares)), update, lambda operands: (operands[2], operands[0]),
            (optimizer_variables, gradients, trainable),
        )
        logs, metrics_variables = model._update_metrics_variables(
            metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
        )
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)

    return step


def _one_pass_summary(x, bucket_count, columns=stats.ALL_COLUMNS, reduce=jnp.max):
    """The one-pass floor's stand-in for `stats.summarize`: one max over ``x``, a histogram of zeros."""
    del columns
    values = jnp.ravel(x).astype(jnp.float32)
    peak = reduce(values) if values.size else jnp.float32(0.0)
    histogram = None if bucket_count is None else jnp.zeros([bucket_count, 3], jnp.float32)
    return jnp.full([stats.ROW], peak), histogram


def _one_pass_and_histogram_summary(x, bucket_count, columns=stats.ALL_COLUMNS):
    """The histogram floor's stand-in: one max, and the histogram kgrad writes, at its cheapest.

    A histogram over [min, max] cannot be counted in the pass that finds
    them: a min, then the bucket index and one scatter per histogram (the max
    is the one-pass floor's own), as `stats` computes it for finite values.
    """
    row, histogram = _one_pass_summary(x, bucket_count, columns)
    values = jnp.ravel(x).astype(jnp.float32)
    if bucket_count is not None and values.size:
        histogram = stats._histogram_of(values, jnp.min(values), row[0], bucket_count)
    return row, histogram


def _read_once_summary(x, bucket_count, columns=stats.ALL_COLUMNS):
    """The read-once floor's stand-in (issue 53): one sum over ``x``, a histogram of zeros."""
    return _one_pass_summary(x, bucket_count, columns, reduce=jnp.sum)


@contextlib.contextmanager
def statistics_replaced_by_one_pass(with_histograms=False, stand_in=None):
    """While a floor's probed step is traced: `stats.summarize` (and `summarize_group`) give one max.

    ``with_histograms``: with the histograms the probe writes as well (the histogram floor).
    ``stand_in``: another stand-in for `stats.summarize` (the read-once floor's sum).
    """
    stand_in = stand_in or (_one_pass_and_histogram_summary if with_histograms else _one_pass_summary)
    real, real_group = stats.summarize, stats.summarize_group
    stats.summarize = stand_in
    stats.summarize_group = lambda items: [stand_in(*item) for item in items]
    try:
        yield
    finally:
        stats.summarize, stats.summarize_group = real, real_group


def stand_in_statistics(config):
    """The context in which ``config``'s probed step is traced: a floor's stand-in statistics, or kgrad's."""
    if config.startswith("floor_one_pass"):
        return statistics_replaced_by_one_pass()
    if config.startswith("floor_histograms"):
        return statistics_replaced_by_one_pass(with_histograms=True)
    if config.startswith("floor_read_once"):
        return statistics_replaced_by_one_pass(stand_in=_read_once_summary)
    return contextlib.nullcontext()
