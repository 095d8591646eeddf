"""Interleaving configurations epoch by epoch inside one process.

Interleaving configurations by calling ``fit`` in turn would pay each
``fit``'s setup (callbacks, iterator, the first call of a traced step after
other functions ran) in every sample. Instead each configuration runs ONE
long ``fit`` in its own thread, and the threads take turns: a thread trains
``epochs`` epochs, then blocks in ``on_epoch_end`` until the scheduler (the
main thread) gives it the next turn. Only one thread runs at a time, so
``time.process_time()`` (CPU time of the whole process) measured over a turn
is the cost of that turn: the other threads are blocked and the dataset does
no prefetching or autotuning in the background. A turn is a number of whole
epochs (`ConfigRunner.run`) or of steps (`ConfigRunner.run_steps`: it ends
after a step, in the middle of an epoch).
"""

import dataclasses
import threading
import time

import keras

#: ``epochs=`` for the long fit; turns end it well before.
_ENDLESS = 10**9
#: Longest wait for one turn before the harness gives up (seconds).
_TURN_TIMEOUT = 3600
#: Warm-up steps counted as setup, outside the CPU budget and the estimate:
#: the first runs the traced (and compiled) step; with ``every_n_steps > 1``
#: the second is the first call of Keras' own step, traced (and with XLA
#: compiled, ~25 CPU-s for the MobileNet) then.
SETUP_STEPS = 2


@dataclasses.dataclass
class Sample:
    """Cost of one turn: CPU seconds, wall seconds, and CPU per epoch."""

    cpu: float
    wall: float
    epoch_cpu: list


class _TurnKeeper(keras.callbacks.Callback):
    """Last callback of the list, so each step's and epoch's callbacks are timed."""

    def __init__(self, runner):
        super().__init__()
        self.runner = runner

    def on_train_batch_end(self, batch, logs=None):
        self.runner._batch_ended()

    def on_epoch_end(self, epoch, logs=None):
        self.runner._epoch_ended()


class ConfigRunner:
    """Trains one configuration in its own thread, a turn at a time.

    Args:
        name: The configuration's name (for messages).
        model: A compiled model.
        dataset: An endless ``tf.data.Dataset``.
        steps_per_epoch: Steps of every epoch.
        callbacks: The configuration's callbacks.

    Attributes:
        error: The exception that ended the fit, if one did.
        aborted: Whether the warm-up's steps after the setup ran past their
            CPU budget, so the fit was stopped.
        step_stamps: Process CPU time after each warm-up step.
        started_cpu: Process CPU time when the fit was started.
    """

    def __init__(self, name, model, dataset, steps_per_epoch, callbacks):
        self.name = name
        self.model = model
        self._fit_args = (dataset, steps_per_epoch, callbacks)
        self.error = None
        self.aborted = False
        self.step_stamps = []
        self.started_cpu = None
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._thread = None
        self._epochs_left = 0
        self._steps_left = None  # a turn of steps (`run_steps`), else None
        self._warming = False
        self._cpu_limit = None
        self._finishing = False
        self._begin = None
        self._epoch_stamps = []
        self._sample = None

    @property
    def alive(self):
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def start(self, epochs, cpu_limit=None):
        """Starts the fit: setup, tracing and ``epochs`` warm-up epochs.

        Args:
            epochs: Epochs of the warm-up turn.
            cpu_limit: Stop the fit when the steps after the first
                `SETUP_STEPS` have used this many CPU seconds: a configuration
                too slow to time.

        Returns:
            The warm-up `Sample`, or ``None`` if the fit failed.
        """
        self._epochs_left = epochs
        self._warming, self._cpu_limit = True, cpu_limit
        self.started_cpu = time.process_time()
        self._thread = threading.Thread(target=self._fit, name=f"bench-{self.name}", daemon=True)
        self._thread.start()
        self._wait()
        self._warming = False
        return self._sample if self.error is None else None

    def run(self, epochs):
        """Trains ``epochs`` more epochs; returns their `Sample` (``None`` on error)."""
        return self._turn(epochs=epochs)

    def run_steps(self, steps):
        """Trains ``steps`` more steps, stopping mid-epoch; returns their `Sample` (``None`` on error).

        Short turns taken in turn share the machine's state (a core that
        vanishes for a second hits every configuration alike): many short
        pairs resolve smaller differences than a few long ones.
        """
        return self._turn(steps=steps)

    def _turn(self, epochs=0, steps=None):
        if not self.alive:
            return None
        self._epochs_left, self._steps_left = epochs, steps
        self._go.release()
        self._wait()
        return self._sample if self.error is None else None

    def finish(self):
        """Ends the fit (``on_train_end`` runs) and joins the thread."""
        if self.alive:
            self._finishing = True
            self._go.release()
            self._wait()
        if self._thread is not None:
            self._thread.join(timeout=_TURN_TIMEOUT)

    def _wait(self):
        if not self._done.acquire(timeout=_TURN_TIMEOUT):
            raise RuntimeError(f"Configuration {self.name!r} did not end its turn in {_TURN_TIMEOUT} s.")

    # -- in the configuration's thread ------------------------------------------

    def _fit(self):
        dataset, steps_per_epoch, callbacks = self._fit_args
        self._begin_turn()
        try:
            self.model.fit(
                dataset,
                epochs=_ENDLESS,
                steps_per_epoch=steps_per_epoch,
                verbose=0,
                shuffle=False,  # the dataset is fixed; silences Keras' warning
                callbacks=[*callbacks, _TurnKeeper(self)],
            )
        except BaseException as error:  # reported by the scheduler, not raised in a thread
            self.error = error
        finally:
            self._end_turn()

    def _begin_turn(self):
        self._epoch_stamps = []
        self._begin = (time.process_time(), time.perf_counter())

    def _end_turn(self):
        cpu, wall = time.process_time(), time.perf_counter()
        marks = [self._begin[0], *self._epoch_stamps]
        self._sample = Sample(
            cpu=cpu - self._begin[0],
            wall=wall - self._begin[1],
            epoch_cpu=[after - before for before, after in zip(marks, marks[1:])],
        )
        self._done.release()

    def _batch_ended(self):
        if self._steps_left is not None:
            self._steps_left -= 1
            if self._steps_left == 0 and not self.model.stop_training:
                self._steps_left = None
                self._take_turn()
            return
        if not self._warming:
            return
        now = time.process_time()
        self.step_stamps.append(now)
        # The budget starts after the setup steps: tracing and compiling cannot
        # be interrupted, and steady steps are what the estimate needs.
        setup_end = self.step_stamps[SETUP_STEPS - 1] if len(self.step_stamps) >= SETUP_STEPS else now
        if self._cpu_limit is not None and now - setup_end > self._cpu_limit:
            self.aborted = True
            self.model.stop_training = True

    def _epoch_ended(self):
        self._epoch_stamps.append(time.process_time())
        self._epochs_left -= 1
        if self._steps_left is not None or self._epochs_left > 0 or self.model.stop_training:
            return  # a stopped fit ends its turn when the thread exits
        self._take_turn()

    def _take_turn(self):
        """Ends this turn and blocks until the scheduler gives the next one."""
        self._end_turn()
        self._go.acquire()
        if self._finishing:
            self.model.stop_training = True
        else:
            self._begin_turn()
