"""Replaying a tripped step of a model's own ``train_step`` (a GAN's, a VAE's).

The guard's every-step check in such a step is each `kgrad.ProbeTape`'s loss
and weight gradients: it says which tape's step went non-finite, not where.
`replay_own_step` runs the model's ``train_step`` once more, eagerly, on the
step's own batch, inside a `ReplayCollection`: every ``ProbeTape`` the step
opens captures every layer, nested layer, ``keras.ops`` node and `kgrad.tap`
of its model, with their inputs, whatever the tape was asked to capture;
each ``tape.gradient`` takes the one backward pass over them and
`kgrad.backends.tensorflow.guard.locate.locate` names where the first NaN/Inf was born. No optimizer
applies anything or scales the loss (mixed precision: the replay
differentiates the true loss), and every variable the step changes is put back.

The replay starts from the weights as the guard left them: the tripped
tape's update was skipped, but a tape that ran *after* it in the same step
(a GAN's generator after its discriminator) applied its own finite update,
which the tripped tape's pass did not see. The report says so.
"""

import keras
import tensorflow as tf

from kgrad.backends.common.batch_dump import is_dump, join_notes, unpack_batch
from kgrad.backends.common.own_step import candidate_optimizers
from kgrad.backends.tensorflow.capture.active_collection import set_active_collection, unique_name
from kgrad.backends.common.locate import in_data
from kgrad.backends.tensorflow.guard.locate import in_weights, locate
from kgrad.backends.tensorflow.summarize.loss_scale import scales_loss
from kgrad.backends.tensorflow.guard.replay_seeds import with_the_step_seeds


class ReplayCollection:
    """Stands in for the `differentiate.custom_step.TapeCollection` while an own ``train_step`` is replayed.

    Args:
        model: The model whose ``train_step`` is replayed.
    """

    #: Each ProbeTape opened in the step captures every operation of its model.
    captures_everything = True
    records_layer_inputs = True

    def __init__(self, model):
        self._optimizers = candidate_optimizers(model)
        self._counts = {}
        self.tapes = []  # the tapes' logged names, in the order they differentiated
        self.births = []  # each non-finite tape's `locate` fields, with ``born_tape``

    def __enter__(self):
        set_active_collection(self)
        for optimizer in self._optimizers:
            # The replay only looks: a skipped update is the guard's; none here.
            object.__setattr__(optimizer, "apply", _apply_nothing)
            if scales_loss(optimizer):
                # The true loss: an overflow of the scaled float16 gradients is
                # the loss scaler's signal, not where a NaN was born.
                object.__setattr__(optimizer, "scale_loss", _unscaled)
        return self

    def __exit__(self, *exc_info):
        set_active_collection(None)
        for optimizer in self._optimizers:
            optimizer.__dict__.pop("apply", None)
            optimizer.__dict__.pop("scale_loss", None)

    def gradient(self, tape, target, sources, output_gradients, unconnected_gradients):
        """The tape's one backward pass over its sources and every captured tensor; locates a NaN."""
        name = unique_name(self._counts, tape.name)
        self.tapes.append(name)
        flat_sources = tf.nest.flatten(sources)
        gradients = tape.probed_gradient(target, flat_sources, output_gradients, unconnected_gradients)
        weight_gradients = {
            source.path: gradient for source, gradient in zip(flat_sources, gradients)
            if isinstance(source, keras.Variable)
        }
        born = locate(tape.probe, tape.model, target, weight_gradients=weight_gradients,
                      check_weights=False)
        if born is not None:
            self.births.append({**born, "born_tape": name})
        return tf.nest.pack_sequence_as(sources, gradients)

    def first_birth(self):
        """The ``born_*`` fields of the first tape that saw where the value was born, or ``None``.

        The step's batch was finite (checked before), so a tape whose own
        input is not was fed a value computed outside its ``with`` block (a
        GAN's fakes, made before the discriminator's tape opens): a later
        tape that computes it inside (the generator's) names where it was born.
        """
        if not self.births:
            return None
        fed = next((i for i, b in enumerate(self.births) if b["born_in"] == "data"), None)
        born = next((i for i, b in enumerate(self.births) if b["born_in"] != "data"), None)
        fed_first = fed is not None and (born is None or fed < born)
        fed = None if fed is None else self.births[fed]
        if born is None:
            return {**fed, "born_in": "forward", "born_type": "input computed outside the tape",
                    "replay_note": (
                        f"ProbeTape {fed['born_tape']!r} received it in its input {fed['born_at']!r}, "
                        "computed before its `with` block, where no tape sees it: compute that input "
                        "inside the block to locate its birth.")}
        born = self.births[born]
        if fed_first:
            note = (f"ProbeTape {fed['born_tape']!r} received it before, in its input "
                    f"{fed['born_at']!r}, computed before its `with` block.")
            return {**born, "replay_note": join_notes(born.get("replay_note"), note)}
        return born


def _apply_nothing(grads, trainable_variables=None):
    return None


def _unscaled(loss):
    return loss


def replay_own_step(model, batch, seeds_after=None):
    """Replays one step of ``type(model).train_step`` eagerly and names where its NaN was born.

    Args:
        model: A model whose class defines its own ``train_step``, with
            `kgrad.ProbeTape`s in it, at the weights the guard left.
        batch: The step's data, as ``train_step`` received it, or the dict of
            a dumped ``.npz``.
        seeds_after: See `kgrad.backends.tensorflow.guard.replay_seeds.with_the_step_seeds`.

    Returns:
        ``(born, note)`` as `kgrad.backends.tensorflow.guard.replay.replay_fields`.
    """
    x, y, sample_weight = unpack_batch(batch)
    born = in_weights(model.weights) or in_data(x, y, sample_weight)
    if born is not None:
        return born, None
    data = keras.utils.pack_x_y_sample_weight(x, y, sample_weight) if is_dump(batch) else batch

    def once():
        collection = ReplayCollection(model)
        with collection:
            type(model).train_step(model, data)
        return collection.first_birth(), collection.tapes

    (born, tapes), seeds_note = with_the_step_seeds(model, once, seeds_after)
    if born is None:
        return None, seeds_note
    later = tapes[tapes.index(born["born_tape"]) + 1:]
    note = None
    if later:
        note = (
            f"ProbeTape{'s' if len(later) > 1 else ''} {', '.join(map(repr, later))} ran after "
            f"{born['born_tape']!r} in the step and may have applied finite updates, which the "
            "replay started from: where they change what that tape's pass computes, it can "
            "differ from the step's."
        )
    return born, join_notes(note, seeds_note)
