"""The instruments a probe asked for (``instruments=``), inside the probed JAX step.

The same tags, meaning and warnings as on TensorFlow
(`kgrad.backends.tensorflow.summarize.instrument_summaries`); what cannot be
computed gets no tag and one warning per trace naming what and why:

- ``"per_example"``: `kgrad.backends.jax.summarize.per_example` (carriers in the backward pass);
- ``"optimizer"``: `kgrad.backends.jax.summarize.optimizer_state` (the state after the
  update), and ``update_rms/`` from the update itself;
- ``"logits"``: `kgrad.backends.jax.summarize.logits` (recorded in the forward pass);
- ``"attention"``: `kgrad.backends.common.attention_scores` (q and k recorded by
  `kgrad.backends.common.attention_calls`, scored in the forward pass; as on TensorFlow).

`Instruments` is a listener of the instrumented pass
(`kgrad.backends.jax.capture.instrumented`): it gives its per-example carriers
once the taps are found, records around the differentiated function, and
sees each prediction (`see_prediction`: the logits' and the attention's
statistics are computed there, while the tensors are alive, and leave the
differentiated function as auxiliary outputs). After the update the step
calls `add_rows`.
"""

import contextlib
import math
import warnings

from kgrad.backends.common import attention_calls
from kgrad.backends.common.attention_scores import call_statistics
from kgrad.backends.common.instrument_warnings import by_reason, warn_instrument
from kgrad.backends.jax.summarize.logits import LogitCapture, logit_statistics
from kgrad.backends.jax.summarize.per_example import PerExampleLayers
from kgrad.backends.jax.summarize.update_norms import weight_and_change_norms
from kgrad.plan.tag_names import io_names
from kgrad.plan.tag_selection import layers_with_a_matrix, weight_tags_written


class Instruments:
    """The instruments of one probed part (`kgrad.backends.jax.own_step.part`).

    Args:
        model: The probed model.
        config: Its `kgrad.plan.options.ProbeConfig`.
        operations_by_name, keep: The captured operations and their predicate.

    ``"optimizer"`` is not its: which optimizer applies a part's gradients is
    known only when it does (`add_optimizer_rows`, called there).
    """

    def __init__(self, model, config, operations_by_name, keep):
        self.model, self.config = model, config
        wanted = config.instruments
        self.per_example = self.capture = None
        if "per_example" in wanted:
            self.per_example = PerExampleLayers(model, operations_by_name, keep)
        if "logits" in wanted:
            self.capture = LogitCapture(model)
        self.attention = None  # the AttentionCapture of the traced step, with "attention"
        self._wants_attention = "attention" in wanted

    # -- a listener of the instrumented pass (`kgrad.backends.jax.capture.instrumented.Listener`) --

    selection = ({}, None)  # it taps no layer of its own: the predictions reach every listener
    inverse_scale = None  # 1 / the loss scale of the pass (mixed precision), else None

    def discovered(self, found, trace):
        """The per-example carriers (``{}`` without ``"per_example"``), of the layers ``trace()`` calls."""
        del found
        return {} if self.per_example is None else self.per_example.carriers_of(trace)

    @contextlib.contextmanager
    def recording(self, carriers):
        """Per-example carriers and logit capture while the differentiated function runs."""
        with contextlib.ExitStack() as stack:
            if self.per_example is not None:
                stack.enter_context(self.per_example.wrap(carriers, self.inverse_scale))
            if self.capture is not None:
                stack.enter_context(self.capture.recording())
            if self._wants_attention:
                self.attention = stack.enter_context(attention_calls.intercept(self.model))
            yield

    def tap(self, key, kind, tensor, carriers, forward):
        del key, carriers
        if kind == "prediction":
            self.see_prediction(forward.setdefault("seen", []), tensor)
        return tensor

    def finish(self, forward):
        return forward.get("seen", [])

    def see_prediction(self, seen, prediction):
        """Appends ``("logits", statistics or None, reason or None)`` of one model output to ``seen``.

        At the first output, every attention layer has run: ``("attention", [(name, max, entropy)])``.
        """
        if self.attention is not None and not any(entry[0] == "attention" for entry in seen):
            examples = self.config.attention_examples
            seen.append(("attention", [call_statistics(call, examples) for call in self.attention.calls]))
        if self.capture is None:
            return
        logits, reason = self.capture.logits(prediction)
        statistics = None if logits is None else logit_statistics(logits)
        seen.append(("logits", statistics, reason))

    def add_rows(self, rows, carried, seen, y_pred):
        """Adds the tags of every instrument but ``"optimizer"`` to ``rows``.

        Args:
            rows: The step's `kgrad.backends.jax.summarize.summaries.SummaryRows`.
            carried: The carriers' cotangents.
            seen: What `see_prediction` gathered.
            y_pred: The step's prediction (for the output names).
        """
        if self.per_example is not None:
            buckets = self.config.bucket_count if self.config.histograms else None
            reasons = self.per_example.add_rows(rows, carried, buckets)
            if reasons:  # once per trace: never a guessed value, but say which are missing
                warnings.warn(f"kgrad: no per-example gradient norms for {by_reason(reasons)}", stacklevel=3)
        self.add_forward_rows(rows, seen, y_pred)

    def add_forward_rows(self, rows, seen, y_pred):
        """The logits' and the attention's tags, from what `see_prediction` gathered."""
        if self.capture is not None:
            names = io_names(y_pred, "output", getattr(self.model, "output_names", None))
            reasons = {}
            outputs = [entry for entry in seen if entry[0] == "logits"]
            for name, (_, statistics, reason) in zip(names, outputs):
                if statistics is None:
                    reasons[name] = reason
                    continue
                for kind, (mean, largest) in statistics.items():
                    rows.add_scalar(f"{kind}_mean/{name}", mean)
                    rows.add_scalar(f"{kind}_max/{name}", largest)
            if reasons:
                warn_instrument("logits", "no logit statistics for " + by_reason(reasons))
        if self._wants_attention:
            self._add_attention(rows, seen)

    def _add_attention(self, rows, seen):
        scored = [entry[1] for entry in seen if entry[0] == "attention"]
        for name, largest, entropy in scored[0] if scored else []:
            for head in range(largest.shape[0]):
                rows.add_scalar(f"attention_logit_max/{name}/head_{head}", largest[head])
                rows.add_scalar(f"attention_entropy/{name}/head_{head}", entropy[head])
        if self.attention is not None and self.attention.reasons:
            said = "no attention statistics for layer " + by_reason(self.attention.reasons)
            warn_instrument("attention", said)
        elif not scored or not scored[0]:
            said = f"model '{self.model.name}' called no attention layer in its step, so nothing is written"
            warn_instrument("attention", said)


def add_optimizer_rows(rows, moments, paths, gradients, before, after, state_after, sigmas, changes=None):
    """``adam_rms/``, ``grad_outlier_fraction/`` (`OptimizerMoments`) and ``update_rms/`` of ``paths``.

    Args:
        rows: The step's `kgrad.backends.jax.summarize.summaries.SummaryRows`.
        moments: The `OptimizerMoments` of the optimizer that applied the gradients.
        paths: ``{weight number: path}`` (`optimizer_paths`).
        gradients: The gradients as the optimizer applied them (unscaled, clipped), numbered as ``paths``.
        before, after: The weights' values before and after the update.
        state_after: The optimizer's variables after the update.
        sigmas: k of the outlier test.
        changes: ``{weight number: ‖Δw‖}`` the weights' rows measured
            (`kgrad.backends.jax.capture.probe_taps.add_weight_rows`); the others are measured here.
    """
    moments.add_rows(rows, paths, gradients, state_after, sigmas)
    if moments.reason is not None:
        warn_instrument("optimizer", moments.reason)
    changes = changes or {}
    for number, path in paths.items():  # ‖Δw‖/√n, any optimizer
        change = changes.get(number)
        if change is None:
            _, change = weight_and_change_norms(before[number], after[number])
        size = float(max(math.prod(before[number].shape), 1))
        rows.add_scalar(f"update_rms/{path}", change / math.sqrt(size))


def optimizer_paths(paths, statistics, gradients):
    """``{weight number: path}`` of the weights with ``update_ratio/``.

    As on TensorFlow, the optimizer's tags go to the weights whose
    ``weight_norm/`` and ``update_ratio/`` are written
    (`kgrad.plan.tag_selection.weight_tags_written`).
    """
    with_a_matrix = layers_with_a_matrix(paths, [gradient.shape for gradient in gradients])
    return {
        number: path
        for number, (path, gradient) in enumerate(zip(paths, gradients))
        if weight_tags_written(statistics, gradient, path.rpartition("/")[0] in with_a_matrix)
    }
