"""Sinks: where kgrad's records go besides TensorBoard (Weights & Biases, MLflow, JSON Lines).

The public names come from ``kgrad``: `kgrad.Sink`, `kgrad.WandbSink`,
`kgrad.MlflowSink`, `kgrad.JsonLinesSink`. Each runs in a worker thread of its
own (`kgrad.sinks.worker`); `kgrad.sinks.fanout` is what the callbacks call.
"""
