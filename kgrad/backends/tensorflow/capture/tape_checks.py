"""What a `kgrad.ProbeTape` checks of its use, and what it says when it cannot give what was asked."""

import warnings


def check_forward_pass(recorder, model, layers, explicit_layers, operations):
    """Raises a ValueError, with the fix, when a tape's forward pass cannot give what was asked.

    Args:
        recorder: The tape's `kgrad.backends.tensorflow.capture.recorder.Recorder`.
        model: The tape's model.
        layers: ``layers=`` as the user passed it (for the message).
        explicit_layers: Whether ``layers`` named layers (rather than ``"all"``).
        operations: The names of the operations the tape captures.
    """
    # A VAE's step calls `self.encoder` and `self.decoder`, never `self`:
    # their layers are still the model's, and are captured.
    if not recorder.model_called and (not recorder.calls_per_name or recorder._watch_inputs):
        needs = " (watch_inputs=True needs the model's own call)" if recorder.calls_per_name else ""
        raise ValueError(
            "`model` was never called inside the `with` block of this "
            f"ProbeTape{needs}. Received: model='{model.name}'. Call it inside "
            "the block (e.g. `y = model(x)`), or open the ProbeTape on the "
            "model you call."
        )
    if not explicit_layers:
        return
    for name in operations:
        if name in recorder.non_float:
            dtypes = [getattr(d, "name", str(d)) for d in recorder.non_float[name]]
            raise ValueError(
                f"`layers` asks for layer {name!r}, which produced no "
                f"floating-point output (output dtypes: {dtypes}), so it has no "
                f"gradient to report. Received: layers={layers!r}. Remove "
                "it from `layers` and probe the first layer after it whose "
                "output is float."
            )
        if name in recorder.unreachable:
            raise ValueError(
                f"`layers` asks for layer {name!r}, which ran inside a loop "
                "traced by tf.function (e.g. an RNN cell inside tf.while_loop, or "
                "tf.map_fn): the tape cannot differentiate with respect to those "
                f"tensors. Received: layers={layers!r}. Probe the layer "
                "that runs the loop (e.g. the LSTM layer) instead."
            )
        if name in recorder.calls_per_name:
            continue
        raise ValueError(
            f"`layers` asks for layer {name!r}, which was never called during "
            f"the forward pass of model '{model.name}' recorded by this "
            f"ProbeTape. Received: layers={layers!r}. Check that the "
            "model's call() uses it, or remove it from `layers`."
        )


def warn_hidden_gradient(name, where=None):
    """Warns that dJ/d(output of ``name``) is unknown: Keras' logits shortcut cut it from the tape."""
    where = where or f"tape.probe.gradients[{name!r}]"
    warnings.warn(
        f"kgrad.ProbeTape: dJ/d(output of {name!r}) is unknown, so {where}"
        f" is None. {name!r} ends in a softmax or sigmoid, and the loss did "
        "not reach it on the tape: Keras computes cross-entropies from the logits "
        "behind such outputs, and no such Keras loss was computed inside this "
        "ProbeTape's `with` block. Compute the loss inside the block, or get dJ/dŷ "
        "with kgrad.prediction_gradient(loss_fn, y_true, y_pred).",
        stacklevel=3,
    )
