"""`kgrad.first_non_finite`: the first non-finite tensor of a `kgrad.ProbeTape`'s pass, and its birth."""

import dataclasses

import tensorflow as tf

from kgrad.backends.common.locate import counts
from kgrad.backends.tensorflow.guard.locate import locate
from kgrad.plan.tag_names import io_names
from kgrad.report.non_finite import report_of_counts


def first_non_finite(probe, step=None, model=None):
    """Checks a `kgrad.ProbeResult` for NaN/Inf, in forward then backward order.

    For custom training loops with `kgrad.ProbeTape`. Call it eagerly (on the
    values a ``tf.function`` returned, if the step is compiled).

    Args:
        probe: A `kgrad.ProbeResult` (``tape.probe``).
        step: Optional step number to put in the report.
        model: The tape's model, for the type and path of the operation
            where the value was born (``born_*``, see `kgrad.backends.common.locate`;
            exact with ``ProbeTape(layers="all", record_inputs=True)``).

    Returns:
        A `NonFiniteReport` for the first non-finite tensor, or ``None``.

    Example:

    >>> import keras, kgrad, tensorflow as tf
    >>> model = keras.Sequential([keras.Input((2,)),
    ...     keras.layers.Lambda(lambda t: tf.math.log(t), name="log"),
    ...     keras.layers.Dense(1, name="out")])
    >>> with kgrad.ProbeTape(model, layers=["log", "out"]) as tape:
    ...     loss = tf.reduce_sum(model(tf.constant([[1.0, -1.0]])))
    >>> _ = tape.gradient(loss, model.trainable_variables)
    >>> report = kgrad.first_non_finite(tape.probe)
    >>> report.kind, report.layer, report.nan_count, report.born_in, report.born_at
    ('activation', 'log', 1, 'forward', 'log')
    """
    if not tf.executing_eagerly():
        raise RuntimeError(
            "`first_non_finite` reads tensor values and must run eagerly. "
            "Return the ProbeResult's tensors from your tf.function and call "
            "it on them outside."
        )
    # Counts of the floating-point values, bfloat16 included.
    report = report_of_counts({name: counts(tensor) for name, tensor in _probe_tensors_in_order(probe)}, step)
    return None if report is None else dataclasses.replace(report, **(locate(probe, model) or {}))


def _probe_tensors_in_order(probe):
    def named(kind, structure, prefix):
        leaves = tf.nest.flatten(structure)
        return [(f"{kind}/{name}", t) for name, t in zip(io_names(structure, prefix), leaves)]

    ordered = named("input", probe.input, "input") if probe.input is not None else []
    ordered += [(f"activation/{name}", t) for name, t in probe.activations.items()]
    if probe.prediction is not None:
        ordered += named("prediction", probe.prediction, "output")
    ordered += [(f"grad/{name}", t) for name, t in reversed(list(probe.gradients.items()))]
    if probe.input_gradient is not None:
        ordered += named("input_grad", probe.input_gradient, "input")
    return ordered
