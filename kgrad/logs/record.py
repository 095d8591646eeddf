"""`ProbeRecord`: one probed step's summaries, as host values, whichever backend computed them."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class ProbeRecord:
    """The summaries of one probed training step, as host values.

    Attributes:
        step: ``optimizer.iterations`` when the step ran (0 for the first step).
        scalars: ``dict`` tag -> ``float``.
        histograms: ``dict`` tag -> ``numpy`` array ``[buckets, 3]`` of
            (left edge, right edge, count).
        tape: In a model's own ``train_step``, the name of the `kgrad.ProbeTape`
            or `kgrad.value_and_grad` the record comes from; ``None`` for the
            model's own probe.

    Example:

    >>> import keras, kgrad, numpy as np
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")])
    >>> model.compile("sgd", "mse")
    >>> records = []
    >>> probe = kgrad.GradientProbe(every_n_steps=1, on_probe=records.append)
    >>> _ = model.fit(np.ones((4, 2)), np.ones((4, 1)), batch_size=2,
    ...               callbacks=[probe], verbose=0)
    >>> [record.step for record in records], records[0].histograms["grad_hist/out"].shape
    ([0, 1], (65, 3))
    """

    step: int
    scalars: dict
    histograms: dict
    tape: object = None

    def __repr__(self):
        """Step, counts and a few scalars: the dataclass repr printed every
        value, ~20,000 characters for a 9-layer MLP.

        >>> from kgrad import ProbeRecord
        >>> ProbeRecord(3, {"grad_norm/a": 0.25, "grad_norm/b": 1e-7, "x/y": 0.5, "z/w": 1.0},
        ...             {"grad_hist/a": None})
        ProbeRecord(step=3, 4 scalars, 1 histograms: grad_norm/a=0.25, grad_norm/b=1e-07, x/y=0.5, ...)
        """
        shown = ", ".join(f"{tag}={_short(value)}" for tag, value in list(self.scalars.items())[:_SHOWN])
        shown = f": {shown}" if shown else ""
        more = ", ..." if len(self.scalars) > _SHOWN else ""
        tape = "" if self.tape is None else f", tape={self.tape!r}"
        return (
            f"ProbeRecord(step={self.step}{tape}, {len(self.scalars)} scalars, "
            f"{len(self.histograms)} histograms{shown}{more})"
        )


_SHOWN = 3  # scalars a ProbeRecord's repr shows


def _short(value):
    try:
        return f"{value:.4g}"
    except (TypeError, ValueError):
        return repr(value)
