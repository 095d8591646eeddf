"""``instruments=["optimizer"]`` on JAX: Adam's second-moment lag and gradient outliers, from its own state.

The same tags and meaning as `kgrad.backends.tensorflow.summarize.optimizer_state`
(see it and docs/instruments.md): ``adam_rms/<weight path>``,
``grad_outlier_fraction/<weight path>`` and ``update_rms/<weight path>``. On
TensorFlow the moments the update is about to write are recomputed from the
state before it; Keras' JAX step is pure, so here they are read from the
optimizer's state *after* ``stateless_apply``: m_t, v_t (and AMSGrad's v̂ max,
Adamax's u_t) at step t = ``iterations`` + 1, the state that TensorFlow's
recomputation equals. Each weight's moments are found in the state tuple by
the position of Keras' per-weight state (`keras_internals.slots`) in
``optimizer.variables``. Lion, Adafactor and SGD get ``update_rms/`` only, and
the reason (`kgrad.backends.common.moment_rules.moment_rule`).
"""

import math

import jax
import jax.numpy as jnp

from kgrad.backends.common.moment_rules import inner_optimizer, moment_rule
from kgrad.backends.jax import keras_internals
from kgrad.backends.jax.summarize.compiled import compiled_on_its_own
from kgrad.backends.jax.summarize.one_pass import reduce_in_one_pass

# The state each rule reads, per weight: Keras' lists, by `keras_internals.slots`' names.
_STATE = {
    "adam": ("momentums", "velocities"),
    "nadam": ("momentums", "velocities"),
    "adamax": ("m", "u"),
}


class OptimizerMoments:
    """Where one optimizer keeps each weight's moments in the JAX state tuple.

    Args:
        optimizer: ``model.optimizer`` (built).
        weights: ``model.trainable_variables``, in the order of the step's gradients.

    Attributes:
        reason: ``None``, or why no ``adam_rms/`` is computed (warned once per trace).
    """

    def __init__(self, optimizer, weights):
        self.rule, self.reason = moment_rule(optimizer)
        self._optimizer = optimizer
        self._indices = {}
        if self.rule is None:
            return
        inner = inner_optimizer(optimizer)
        position = {id(variable): index for index, variable in enumerate(optimizer.variables)}
        iterations = inner.iterations
        self._iterations = position[id(iterations)]
        first, second = _STATE[self.rule]
        for number, weight in enumerate(weights):
            try:
                index = keras_internals.variable_index(inner, weight)
            except KeyError:
                continue  # not among the optimizer's variables: it does not update it
            hat = None
            if self.rule == "adam" and inner.amsgrad:
                hat = position[id(keras_internals.slots(inner, "velocity_hats")[index])]
            self._indices[number] = (
                position[id(keras_internals.slots(inner, first)[index])],
                position[id(keras_internals.slots(inner, second)[index])],
                hat,
            )

    def moments_after(self, number, state_after):
        """``(first, second, AMSGrad's max or None)`` of weight ``number`` in ``state_after``, or ``None``."""
        if number not in self._indices:
            return None
        return tuple(None if i is None else state_after[i] for i in self._indices[number])

    def step_after(self, state_after):
        """t: the optimizer's iterations in ``state_after``, as float32."""
        return jnp.asarray(state_after[self._iterations], jnp.float32)

    def add_rows(self, rows, paths, gradients, state_after, sigmas):
        """Adds ``adam_rms/`` and ``grad_outlier_fraction/`` of the weights numbered in ``paths``.

        Args:
            rows: The step's `kgrad.backends.jax.summarize.summaries.SummaryRows`.
            paths: ``{weight number: tag path}`` of the weights that get tags.
            gradients: The gradients as the optimizer applied them (unscaled, then clipped as it
                clips: clipnorm, clipvalue, global_clipnorm over all it applied), one per weight.
            state_after: The optimizer's variables after ``stateless_apply``.
            sigmas: k of the outlier test.
        """
        if self.rule is None:
            return
        inner = inner_optimizer(self._optimizer)
        step = jnp.asarray(state_after[self._iterations], jnp.float32)  # t: advanced by the update
        hyper = [jnp.float32(getattr(inner, name)) for name in ("beta_1", "beta_2", "epsilon")]
        for number, path in paths.items():
            if number not in self._indices:
                continue
            first, second, hat = (None if i is None else state_after[i] for i in self._indices[number])
            rms, outliers = moment_statistics(
                self.rule, gradients[number], first, second, hat, step, hyper, sigmas
            )
            rows.add_scalar(f"adam_rms/{path}", rms)
            if outliers is not None:
                rows.add_scalar(f"grad_outlier_fraction/{path}", outliers)


def adam_scaled(rule, gradient, second, second_max, step, hyper):
    """The gradient over Adam's denominator, √v̂ + ε: the tensor whose RMS is ``adam_rms``.

    ``rule``, ``second``, ``second_max``, ``step`` and ``hyper`` as in `moment_statistics`.
    """
    beta_2, epsilon = hyper[1], hyper[2]
    # Adam's update takes √v of the same v: XLA merged the two √v into one value read by two
    # fusions, and wrote it out whole, the size of the weight (8 MB per device on an MLP
    # 1024-2048-1024 on 8 CPU devices). Behind the barrier, each fusion computes its own √v as it reads.
    second = jax.lax.optimization_barrier(second)
    if rule == "adamax":
        return gradient / (second.astype(jnp.float32) + epsilon)
    second = second.astype(jnp.float32)
    second_correction = 1.0 - jnp.power(beta_2, step)
    if rule == "nadam":
        return gradient / (jnp.sqrt(second / second_correction) + epsilon)
    denominator = second if second_max is None else second_max.astype(jnp.float32)
    return gradient * jnp.sqrt(second_correction) / (jnp.sqrt(denominator) + epsilon)


def rms_from_squares(squares, shape):
    """``adam_rms`` from the sum of the squares of `adam_scaled` (NaN for an empty weight: no mean)."""
    size = math.prod(shape) or jnp.nan
    return jnp.sqrt(squares / size)


@compiled_on_its_own(static_argnames=("rule", "sigmas"))
def moment_statistics(rule, gradient, first, second, second_max, step, hyper, sigmas):
    """``(adam_rms, outlier fraction or None)`` of one weight, from its moments after the step.

    Args:
        rule: What `moment_rule` returned.
        gradient: The float32 gradient the optimizer applied.
        first, second: m_t and v_t (Adamax: m_t and u_t) after the update.
        second_max: AMSGrad's max of v's after the update, or ``None``.
        step: t, the optimizer's iterations after the update.
        hyper: ``(beta_1, beta_2, epsilon)``.
        sigmas: k of the outlier test.

    Example:

    >>> import jax.numpy as jnp
    >>> g = jnp.array([0.5, -2.0])  # Adam's first step: m = 0.1 g, v = 0.001 g²
    >>> rms, outliers = moment_statistics(
    ...     "adam", g, 0.1 * g, 0.001 * g * g, None, 1.0, (0.9, 0.999, 0.0), 6.0)
    >>> round(float(rms), 4), float(outliers)
    (1.0, 0.0)
    """
    scaled = adam_scaled(rule, gradient, second, second_max, step, hyper)
    if rule == "adamax":
        return rms_from_squares(jnp.sum(jnp.square(scaled)), scaled.shape), None
    beta_1, beta_2, _ = hyper
    first, second = first.astype(jnp.float32), second.astype(jnp.float32)
    first_hat = first / (1.0 - jnp.power(beta_1, step))
    second_hat = second / (1.0 - jnp.power(beta_2, step))
    variance = second_hat - jnp.square(first_hat)
    # Where v̂ ≤ m̂² (one step of history: equal up to rounding) there is no
    # spread to measure against: not an outlier.
    spread = sigmas * jnp.sqrt(jnp.maximum(variance, 0.0))
    outlier = (variance > 0) & (jnp.abs(gradient - first_hat) > spread)
    # One reduction of both: as one each, XLA's CPU backend wrote the outlier mask out whole first.
    squares, outliers = reduce_in_one_pass((jnp.square(scaled), 0.0, jnp.add), (outlier, 0, jnp.add))
    size = math.prod(scaled.shape) or jnp.nan  # (an empty weight has no mean: NaN, as before)
    return rms_from_squares(squares, scaled.shape), outliers.astype(jnp.float32) / size
