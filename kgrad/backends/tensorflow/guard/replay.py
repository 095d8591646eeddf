"""Replaying a tripped step eagerly, to name the operation where its first NaN/Inf was born.

The guard's every-step check (the loss and the weight gradients) says *that*
a step went non-finite, not *where*. A trip is rare and its step can be run
again: `replay` runs the step's own batch once more, eagerly, from the
weights before the bad update (the guard skipped it), with every layer,
nested layer, ``keras.ops`` node and `kgrad.tap` captured, forward and
backward. `locate` then names the first operation whose inputs are all
finite and whose output is not (forward order), or, when the forward pass is
finite, the first operation whose backward pass turns finite dJ/d(output)
into a non-finite dJ/d(input), from the loss down.
"""

from kgrad.backends.tensorflow import keras_internals
from kgrad.backends.common.batch_dump import unpack_batch
from kgrad.backends.common.own_step import has_own_train_step
from kgrad.backends.tensorflow.guard.locate import in_weights, locate
from kgrad.backends.tensorflow.guard.loss_parts import loss_parts
from kgrad.backends.tensorflow.guard.replay_seeds import with_the_step_seeds

def replay_fields(model, batch, seeds_after=None):
    """Runs one training step's forward and backward pass again, eagerly, and `locate`s its NaN.

    Nothing is applied: the weights stay as they are, and the state the
    replay changes (BatchNormalization statistics, seed generators, the
    compiled loss's trackers) is put back. A random layer draws what the
    tripped step drew (`kgrad.backends.tensorflow.guard.replay_seeds`). A model with its own
    ``train_step`` is replayed by `kgrad.backends.tensorflow.guard.own_step_replay`.

    Args:
        seeds_after: The model's seed-generator states right after the
            tripped step, if later steps drew on (see `with_the_step_seeds`).

    Returns:
        ``(born, note)``: the ``born_*`` fields of `locate` (``None`` if the
        replay was finite), and what may make the replay differ from the step.
    """
    if has_own_train_step(model):
        from kgrad.backends.tensorflow.guard.own_step_replay import replay_own_step

        return replay_own_step(model, batch, seeds_after)
    x, y, sample_weight = unpack_batch(batch)
    return with_the_step_seeds(model, lambda: _replay_once(model, x, y, sample_weight), seeds_after)


def _replay_once(model, x, y, sample_weight):
    from kgrad.backends.tensorflow.capture import forward
    from kgrad.backends.tensorflow.capture.tape import ProbeTape

    born = in_weights(model.weights)  # before the forward pass updates any statistic
    if born is not None:
        return born
    with ProbeTape(model, layers="all", watch_inputs=True, persistent=True,
                   record_inputs=True, _integer_inputs="skip") as tape:
        prediction = forward.forward(model, x)
        loss = keras_internals.compute_loss(
            model, x=x, y=y, y_pred=prediction, sample_weight=sample_weight, training=True
        )
    weights = model.trainable_weights
    gradients = tape.gradient(loss, weights)
    return locate(tape.probe, model, loss, y, sample_weight,
                  {weight.path: gradient for weight, gradient in zip(weights, gradients)},
                  check_weights=False,
                  loss_terms=lambda: loss_parts(model, y, prediction, sample_weight))

