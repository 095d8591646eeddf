"""``instruments=["attention"]`` on TensorFlow: the attention tags of a probed step, replicas gathered.

The scores and their statistics are written once for every backend
(`kgrad.backends.common.attention_scores`, which documents the tags). What is
TensorFlow's own: under ``tf.distribute`` each replica scores its own first
``attention_examples`` examples, and the per-example statistics are gathered
across the replicas before they are reduced to one value per head, so that the
tags are of the global sub-batch.
"""

from kgrad.backends.common.attention_scores import call_statistics
from kgrad.backends.tensorflow.handover import replicas


def add_attention_summaries(builder, calls, examples):
    """Adds the attention tags of every captured call to ``builder``.

    Args:
        builder: A `kgrad.backends.tensorflow.summarize.summaries.SummaryBuilder`.
        calls: The step's `kgrad.backends.common.attention_calls.AttentionCall`s.
        examples: How many examples of the batch (per replica) are scored.
    """
    for call in calls:
        name, largest, entropy = call_statistics(call, examples, gather_batch=replicas.gather_batch)
        # Gathered over replicas, the statistics' static shape may be unknown: the query's is not.
        heads = range(call.query.shape[2])
        builder.add_scalars([f"attention_logit_max/{name}/head_{h}" for h in heads], largest)
        builder.add_scalars([f"attention_entropy/{name}/head_{h}" for h in heads], entropy)
