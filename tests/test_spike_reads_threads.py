"""A skip is read once, though Keras' JAX worker threads run batch ends side by side.

Keras runs an ``async_safe`` callback's batch ends in a thread pool, so two batch
ends can both see the same unread skip. Before the guard held `SpikeSkipping.lock`
from the news to the read, both read it (the CI run of 2026-12-06 logged a JAX read
at steps 51 and 52 for one skip at step 50).
"""

import threading
import time
import types

import kgrad
from kgrad.callbacks.spike_skipping import SpikeSkipping


class _Clean:
    """A computed trip flag that says clean."""

    def is_ready(self):
        return True

    def __bool__(self):
        return False


class _OneSkipStep:
    """A step whose device says one skip until the host has read it (a read takes a while)."""

    reports_at_epoch_end = True  # as JAX's: the trip flag is read once computed

    def __init__(self):
        self.skips, self.seen, self.reads = 1, 0, 0
        self.guard_tripped = _Clean()

    def spike_news(self):
        return self.skips > self.seen

    def guard_states(self):
        return {None: self}

    def read_spikes(self, optimizer):
        self.reads += 1
        time.sleep(0.3)  # a device read: long enough for another batch end to see the news
        self.seen = self.skips
        return None


def test_two_batch_ends_at_once_read_one_skip_once():
    guard = kgrad.NonFiniteGuard(skip_spikes=True)
    step = _OneSkipStep()
    guard._step, guard._spikes = step, SpikeSkipping(6.0, 128, None, 3)
    guard._model = types.SimpleNamespace(steps_per_execution=1, optimizer=None)
    batch_ends = [threading.Thread(target=guard.on_train_batch_end, args=(batch,)) for batch in range(2)]
    for thread in batch_ends:
        thread.start()
    for thread in batch_ends:
        thread.join()
    assert step.reads == 1
    guard.on_train_batch_end(2)  # nothing new: no read
    assert step.reads == 1
