"""Probing a model's own ``train_step``: each `kgrad.ProbeTape` in it reports to the probe.

A GAN, a VAE or any model with its own ``train_step`` differentiates with
tapes of its own, often several per step, over sub-models
(``self.generator``, ``self.discriminator``), each applied by its own
optimizer. While a `kgrad.GradientProbe` trains such a model, kgrad runs
the model's ``train_step`` inside a `TapeCollection`: every ``ProbeTape``
opened in it hands its ``gradient`` call to the collection, which, on probed
steps, takes the one backward pass over the weights *and* the captured
tensors (`kgrad.ProbeTape.probed_gradient`) and summarizes it with a
`kgrad.pipeline.ProbePipeline` of that tape; on other steps the tape takes the
plain pass. The gradients the user's step receives, and applies, are the ones
it asked for. After the step (the updates applied), each tape's record is
written with its update ratios.

Each tape is logged under a name: ``ProbeTape(..., name=...)``, else its
model's name, with ``#2``, ``#3``... for a name used again in the same step.
Its step is ``optimizer.iterations`` of the optimizer that applied the tape's
weights, read before the update.
"""

import threading

import keras
import tensorflow as tf

from kgrad.branching import join_sparse, split_sparse

_LOCAL = threading.local()


def active_collection():
    """The collection of the ``train_step`` being traced in this thread, or ``None``."""
    return getattr(_LOCAL, "collection", None)


class TapeCollection:
    """What the ProbeTapes of one traced ``train_step`` computed.

    Args:
        model: The model whose ``train_step`` runs.
        plan: The `kgrad.plan.StepPlan`.
        probe_now: Scalar bool tensor: whether this step is probed.
        pipeline_for: ``fn(name, tape_model) -> ProbePipeline``.
    """

    def __init__(self, model, plan, probe_now, pipeline_for):
        self._model = model
        self._plan = plan
        self._probe_now = probe_now
        self._pipeline_for = pipeline_for
        self._optimizers = _candidate_optimizers(model)
        self._entries = []  # (pipeline, weights, scalars, histograms, iterations before)
        self._names = {}

    def __enter__(self):
        if active_collection() is not None:
            raise RuntimeError("kgrad: a probed train_step ran inside another one.")
        _LOCAL.collection = self
        return self

    def __exit__(self, *exc_info):
        _LOCAL.collection = None

    def tape_names(self):
        """The names the tapes were logged under, in the order they differentiated."""
        return [pipeline.name for pipeline, *_ in self._entries]

    def gradient(self, tape, target, sources, output_gradients, unconnected_gradients):
        """``tape.gradient``, with the full pass and summaries on probed steps."""
        name = self._unique(tape.name)
        pipeline = self._pipeline_for(name, tape.model)
        flat_sources = tf.nest.flatten(sources)
        weights = [source for source in flat_sources if isinstance(source, keras.Variable)]
        where = [index for index, source in enumerate(flat_sources) if isinstance(source, keras.Variable)]
        # Read before the user's step applies the update (program order).
        iterations = {id(o): tf.identity(o.iterations) for o in self._optimizers}
        arguments = (output_gradients, unconnected_gradients)

        def probed():
            gradients = tape.probed_gradient(target, flat_sources, *arguments)
            builder = pipeline.summarize(
                tape.probe, [gradients[index] for index in where], weights, x=tape.probe.input,
                prediction_gradient=_prediction_gradient(tape.probe),
            )
            return split_sparse(gradients), builder.scalars(), builder.histograms()

        def plain():
            gradients = tape.plain_gradient(target, flat_sources, *arguments)
            return (split_sparse(gradients), *pipeline.no_summaries())

        if self._plan.probes_every_step:
            gradients, scalars, histograms = probed()
        else:
            gradients, scalars, histograms = tf.cond(self._probe_now, probed, plain)
        gradients = join_sparse(gradients, flat_sources)
        self._entries.append((pipeline, weights, scalars, histograms, iterations))
        return tf.nest.pack_sequence_as(sources, gradients)

    def write_records(self):
        """Writes each tape's record; call after the ``train_step`` applied its updates."""
        for pipeline, weights, scalars, histograms, iterations in self._entries:
            step = iterations[id(self._applying_optimizer(pipeline.name, weights))]

            def write(pipeline=pipeline, step=step, scalars=scalars, histograms=histograms, weights=weights):
                pipeline.record(step, scalars, histograms, weights)
                return tf.no_op()

            if self._plan.probes_every_step:
                write()
            else:
                tf.cond(self._probe_now, write, tf.no_op)

    def _unique(self, name):
        count = self._names.get(name, 0) + 1
        self._names[name] = count
        return name if count == 1 else f"{name}#{count}"

    def _applying_optimizer(self, name, weights):
        # Built by now: a Keras optimizer builds on its first apply, which ran
        # in this trace if it did not run before.
        for optimizer in self._optimizers:
            tracked = getattr(optimizer, "_trainable_variables_indices", {})
            if any(optimizer._var_key(weight) in tracked for weight in weights):
                return optimizer
        raise ValueError(
            f"kgrad.GradientProbe: no optimizer of model '{self._model.name}' applied the "
            f"gradients of ProbeTape {name!r} in its train_step, so the step to log them "
            f"at (that optimizer's `iterations`) is unknown. Received optimizers: "
            f"{[type(o).__name__ for o in self._optimizers] or 'none'}. Apply them with an "
            "optimizer that is an attribute of the model (e.g. `self.d_optimizer = "
            "keras.optimizers.Adam()` in compile(), or the model's compiled optimizer)."
        )


def run_own_train_step(model, plan, data, probe_now, pipeline_for):
    """Runs ``type(model).train_step`` in a `TapeCollection`, then writes the records.

    Raises:
        ValueError: With a guard or several replicas (not supported yet), or
            when the step opened no `kgrad.ProbeTape`.
    """
    if plan.guard is not None or plan.replicas > 1:
        raise ValueError(
            f"kgrad cannot guard or distribute model '{model.name}': its class "
            f"{type(model).__name__} defines its own train_step, where kgrad.GradientProbe "
            "works on one device and kgrad.NonFiniteGuard is not supported yet. Use "
            "kgrad.first_non_finite(tape.probe) inside that train_step instead."
        )
    with TapeCollection(model, plan, probe_now, pipeline_for) as collection:
        outputs = type(model).train_step(model, data)
    if not collection.tape_names():
        raise ValueError(
            f"kgrad.GradientProbe found no kgrad.ProbeTape in the train_step of model "
            f"'{model.name}' (class {type(model).__name__}), so it has nothing to log. "
            "In that train_step, replace `tf.GradientTape()` with `kgrad.ProbeTape(self)` "
            "(or `kgrad.ProbeTape(self.generator)` for a sub-model)."
        )
    collection.write_records()  # after the step's own updates
    return outputs


def _candidate_optimizers(model):
    candidates = [model.optimizer] + [
        value for value in vars(model).values() if isinstance(value, keras.optimizers.Optimizer)
    ]
    unique = []
    for optimizer in candidates:
        if isinstance(optimizer, keras.optimizers.Optimizer) and all(optimizer is not o for o in unique):
            unique.append(optimizer)
    return unique


def _prediction_gradient(probe):
    """``fn() -> dJ/dŷ`` of the tape's model when its outputs were captured, else ``None``.

    In a custom step kgrad does not know the loss, so dJ/dŷ is what the
    tape's backward pass found for the captured output layer.
    """
    if probe.prediction is None:
        return None
    by_tensor = {id(tensor): name for name, tensor in probe.activations.items()}
    leaves = tf.nest.flatten(probe.prediction)
    names = [by_tensor.get(id(leaf)) for leaf in leaves]
    if None in names or any(probe.gradients[name] is None for name in names):
        return None
    return lambda: tf.nest.pack_sequence_as(probe.prediction, [probe.gradients[n] for n in names])
