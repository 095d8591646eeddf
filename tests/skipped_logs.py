"""Event files of a run in which a `NonFiniteGuard` skipped steps, written with kgrad's own writer.

The tags are the guard's contract (docs/tags.md): every step ``global/step_skipped``,
``global/spike_score`` and the window's statistics; for each skipped step, per weight,
``skip_<value>/<w>`` and ``skip_z_<value>/<w>``. Shared by the report's tests and the
tab's browser tests.
"""

import numpy as np
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata

from kgrad.logs.event_file import EventFile
from kgrad.logs.summary_bytes import scalar_proto

STEPS = 40
SKIPPED = (18, 27)
#: Layers in forward order (not alphabetical: the tab's rows must follow this order).
LAYERS = ("zeta", "block/mha/query", "block/mha/key", "alpha")
#: Per skipped step, per weight: (grad_norm, z of grad_norm, update_ratio, z of update_ratio).
SKIP_VALUES = {
    18: {"zeta/kernel": (0.9, 41.0, 0.2, 40.0), "block/mha/query/kernel": (0.5, 12.0, 0.1, 3.0),
         "block/mha/key/kernel": (0.4, 2.0, 0.05, 1.0), "block/mha/key/bias": (3e-10, 900.0, 0.3, 800.0),
         "alpha/kernel": (0.1, 40.5, 0.01, 0.5)},
    27: {"zeta/kernel": (0.2, 1.0, 0.01, 0.2), "block/mha/query/kernel": (0.3, 2.0, 0.02, 0.1),
         "block/mha/key/kernel": (0.3, 1.5, 0.02, 0.3), "block/mha/key/bias": (2e-10, 300.0, 0.2, 50.0),
         "alpha/kernel": (2.0, 64.0, 0.9, 70.0)},
}


def write_skipped_run(run_dir, stability=True):
    """Writes the run into ``run_dir``: the guard's tags, a probe's gradient norms and, when
    ``stability``, adam_rms per weight and the loss (with a loss spike at step 30)."""
    rng = np.random.default_rng(0)
    events = EventFile(str(run_dir))
    described = set()
    for step in range(STEPS):
        scalars = {"global/step_skipped": 1.0 if step in SKIPPED else 0.0,
                   "global/spike_score": 9.0 if step in SKIPPED else float(rng.uniform(0, 2)),
                   "spike_window_mean/log_loss": 1.0, "spike_window_std/log_loss": 0.05,
                   "spike_window_mean/log_grad_norm": 0.5, "spike_window_std/log_grad_norm": 0.1}
        for layer in LAYERS:
            scalars[f"grad_norm/{layer}"] = float(rng.uniform(0.1, 0.2))
            scalars[f"weight_grad_norm/{layer}/kernel"] = float(rng.uniform(0.1, 0.2))
            if stability:
                scalars[f"adam_rms/{layer}/kernel"] = 5.0 if (layer, step) == ("alpha", 29) else float(
                    rng.uniform(0.9, 1.0))
        if stability:
            scalars["global/loss"] = 9.0 if step == 30 else float(rng.uniform(0.9, 1.0))
        for weight, (norm, z_norm, ratio, z_ratio) in SKIP_VALUES.get(step, {}).items():
            scalars.update({f"skip_grad_norm/{weight}": norm, f"skip_z_grad_norm/{weight}": z_norm,
                            f"skip_update_ratio/{weight}": ratio, f"skip_z_update_ratio/{weight}": z_ratio,
                            f"skip_cos_grad_weight/{weight}": -0.5})
        summary = summary_pb2.Summary()
        for tag, value in scalars.items():
            entry = summary.value.add(tag=tag)
            if tag not in described:
                described.add(tag)
                entry.metadata.CopyFrom(scalar_metadata.create_summary_metadata(display_name=tag, description=""))
            entry.tensor.CopyFrom(scalar_proto(value))
        events.write_summary(summary.SerializeToString(), step)
    events.close()
