"""Global-batch views of per-replica tensors under ``tf.distribute``.

Inside a replica of a ``MirroredStrategy`` (or multi-worker) step, each
replica holds its own slice of the batch and the loss Keras differentiates is
that replica's share of the global mean. dJ/d(activation) on a slice is
therefore already the gradient of the global loss; weight gradients must be
summed over replicas; statistics must be taken over the gathered batch. These
helpers are identities outside a multi-replica context.
"""

import threading

import tensorflow as tf

from kgrad.backends.tensorflow import keras_internals


def _replica_context():
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context


def multi_replica():
    """True inside a replica of a strategy with more than one replica."""
    return _replica_context() is not None


def gather_batch(tensor):
    """The global batch: ``tensor`` of every replica concatenated on axis 0."""
    context = _replica_context()
    if context is None or tensor.shape.rank == 0:
        return tensor
    return context.all_gather(tensor, axis=0)


def sum_over_replicas(tensor):
    """``tensor`` summed over replicas (e.g. weight gradients)."""
    context = _replica_context()
    if context is None:
        return tensor
    return context.all_reduce(tf.distribute.ReduceOp.SUM, tensor)


def create_variables(model, create):
    """Runs ``create()``, making kgrad's variables mirrored with the model's.

    Every replica writes the same values into them (they are computed from
    gathered tensors), so the first replica's write is kept. The variables
    are created eagerly (lifted out of the traced step), in the cross-replica
    context of the model's strategy.

    Args:
        model: The model whose ``distribute_strategy`` to use.
        create: A function with no arguments that creates the variables.

    Returns:
        What ``create`` returns.
    """

    def in_cross_replica_context(strategy=None):
        with tf.init_scope():
            return _outside_traced_functions(model.distribute_strategy, create)

    if multi_replica():
        return tf.distribute.get_replica_context().merge_call(in_cross_replica_context)
    return in_cross_replica_context()


def _outside_traced_functions(strategy, create):
    """Runs ``create()`` in a thread of its own, in ``strategy``'s scope.

    A ``tf.function`` that sees a variable created while it traces (even
    lifted out by ``tf.init_scope``) traces itself a second time, which for
    the probing step of a large model costs as much as the first. The
    variable-creator scopes through which it sees them are per thread.
    """
    result, errors = [], []

    def run():
        try:
            with strategy.scope():
                result.append(create())
        except BaseException as error:  # re-raised in the calling thread
            errors.append(error)

    thread = threading.Thread(target=run, name="kgrad-create-variables")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


def state_variable(initial_value, name):
    """A non-trainable variable that replicas update once per step."""
    return tf.Variable(
        initial_value,
        trainable=False,
        name=name,
        synchronization=tf.VariableSynchronization.ON_WRITE,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


def scatter_nd_update(variable, indices, updates):
    """``variable.scatter_nd_update(indices, updates)``, on every replica's copy of a mirrored one.

    A distributed variable has no ``scatter_nd_update`` of its own: it
    forwards the call to one copy (the replica's own in a replica context,
    the first in the cross-replica context, where the guard of several
    replicas writes its state: `kgrad.backends.tensorflow.guard.replicated`).
    """
    if isinstance(variable, tf.distribute.DistributedValues) and tf.distribute.in_cross_replica_context():
        return variable.distribute_strategy.extended.update(
            variable, lambda copy, values: copy.scatter_nd_update(indices, values), args=(updates,)
        )
    return variable.scatter_nd_update(indices, updates)


#: Strategies kgrad is tested with, besides Keras' default (no strategy).
SUPPORTED_STRATEGIES = (
    tf.distribute.OneDeviceStrategy,
    tf.distribute.MirroredStrategy,
    tf.distribute.MultiWorkerMirroredStrategy,
)


def check_strategy(model, user):
    """Raises for a strategy kgrad does not support yet.

    Args:
        model: The model about to be trained with probing.
        user: What is probing, for the message (e.g. ``"kgrad.GradientProbe"``).

    Raises:
        ValueError: Under a strategy not in `SUPPORTED_STRATEGIES`
            (TPUStrategy, ParameterServerStrategy, CentralStorageStrategy...).
    """
    # Keras keeps `_distribute_strategy` None when no strategy scope was used.
    strategy = keras_internals.distribute_strategy(model)
    if strategy is None or isinstance(strategy, SUPPORTED_STRATEGIES):
        return
    raise ValueError(
        f"{user} does not support {type(strategy).__name__} yet. Received: model "
        f"'{model.name}' created under {type(strategy).__name__}. kgrad is tested on "
        "a single device, with tf.distribute.MirroredStrategy and "
        "tf.distribute.MultiWorkerMirroredStrategy; train under one of those, or "
        "without kgrad under this strategy."
    )


def is_chief(strategy):
    """Whether this process is the chief of its cluster (True without one).

    The chief is the task of type ``"chief"``, or worker 0 when the cluster
    has no chief, as in TensorFlow's multi-worker conventions.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if not task_type or task_type == "chief":
        return True
    if task_type != "worker":
        return False
    return resolver.task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()
