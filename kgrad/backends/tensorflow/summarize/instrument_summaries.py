"""The instruments a probe asked for (``instruments=``), added to a probed step's summaries.

Each instrument computes on device, in the probed step only; what it cannot
compute gets no tag and one warning per trace naming what and why (never a zero):

- ``"per_example"``: `kgrad.backends.tensorflow.summarize.instruments`;
- ``"optimizer"``: `kgrad.backends.tensorflow.summarize.optimizer_state` (``update_rms/``
  is added by `ProbePipeline.record`, from the update itself);
- ``"logits"``: `kgrad.backends.tensorflow.summarize.logits`;
- ``"attention"``: `kgrad.backends.tensorflow.summarize.attention`.
"""

import warnings

from kgrad.backends.common.instrument_warnings import by_reason, warn_instrument
from kgrad.backends.tensorflow.summarize import model_io
from kgrad.plan.tag_selection import layers_with_a_matrix, weight_tags_written


def add_instruments(pipeline, builder, probe, gradients, weights, unscale):
    """Adds the summaries of ``pipeline.config.instruments`` to ``builder``.

    Args:
        pipeline: The `kgrad.backends.tensorflow.summarize.pipeline.ProbePipeline`.
        builder: Its `SummaryBuilder` of this step.
        probe: The step's `kgrad.ProbeResult`.
        gradients: The tape's gradients of ``weights`` (of the possibly scaled loss).
        weights: The trainable weights, before the update.
        unscale: ``fn(gradient) -> float32 gradient of the true loss``.
    """
    instruments = pipeline.config.instruments
    if "per_example" in instruments:
        _add_per_example(pipeline.model, builder, probe, gradients, weights, unscale)
    if "optimizer" in instruments:
        _add_optimizer(pipeline, builder, gradients, weights, unscale)
    if "logits" in instruments:
        from kgrad.backends.tensorflow.summarize.logits import add_logit_summaries

        reasons = add_logit_summaries(builder, pipeline.model, probe.prediction)
        if reasons:
            warn_instrument("logits", "no logit statistics for " + by_reason(reasons))
    if "attention" in instruments:
        _add_attention(pipeline, builder, probe.attention)


def _add_attention(pipeline, builder, capture):
    from kgrad.backends.tensorflow.summarize.attention import add_attention_summaries

    if capture is None:
        warn_instrument("attention", "this tape did not record the attention layers: nothing is written")
        return
    add_attention_summaries(builder, capture.calls, pipeline.config.attention_examples)
    if capture.reasons:
        warn_instrument("attention", "no attention statistics for layer " + by_reason(capture.reasons))
    elif not capture.calls:
        model = getattr(pipeline.model, "name", "the model")
        warn_instrument(
            "attention", f"model '{model}' called no attention layer in its step, so nothing is written"
        )


def _add_per_example(model, builder, probe, gradients, weights, unscale):
    from kgrad.backends.tensorflow.summarize.instruments import (
        add_per_example_summaries,
        describe_unsupported,
    )

    # ‖∇J‖² of a weight is its tape gradient's (one product less per
    # weight than summing the per-example ones again), unless a loss of
    # `add_loss` (beyond the weights' own regularizers) may depend on it.
    regularized = sum(1 for weight in weights if getattr(weight, "regularizer", None) is not None)
    added_losses = len(model.losses) > regularized
    unsupported = add_per_example_summaries(
        builder, model, probe, probe.layer_inputs, weights, unscale=unscale,
        gradients=None if added_losses else gradients,
    )
    if unsupported:  # once per trace: never a guessed value, but say which are missing
        warnings.warn(
            f"kgrad: no per-example gradient norms for {describe_unsupported(unsupported)}",
            stacklevel=3,
        )


def optimizer_weight_paths(model, statistics, gradients, weights):
    """``{id(weight): path}`` of the weights that get optimizer tags: those with an ``update_ratio/``."""
    paths = [model_io.model_relative_path(model, weight) for weight in weights]
    with_a_matrix = layers_with_a_matrix(paths, [weight.shape for weight in weights])
    return {
        id(weight): path
        for weight, path, gradient in zip(weights, paths, gradients)
        if gradient is not None
        and weight_tags_written(statistics, gradient, path.rpartition("/")[0] in with_a_matrix)
    }


def _add_optimizer(pipeline, builder, gradients, weights, unscale):
    from kgrad.backends.tensorflow.summarize.optimizer_state import add_optimizer_summaries

    if pipeline.name is not None:
        # A tape of a model's own train_step: which optimizer applies its
        # gradients is not known when they are summarized.
        reason = (
            f"tape '{pipeline.name}' of a custom train_step: kgrad does not know which optimizer "
            "applies its gradients, so it gives no adam_rms/ or grad_outlier_fraction/"
        )
    else:
        paths = optimizer_weight_paths(pipeline.model, pipeline.config.statistics, gradients, weights)
        reason = add_optimizer_summaries(
            builder, pipeline.optimizer, gradients, weights, paths, unscale,
            pipeline.config.outlier_sigmas,
        )
    if reason is not None:
        warn_instrument("optimizer", reason)

