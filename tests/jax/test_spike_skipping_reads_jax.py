"""On JAX, `NonFiniteGuard(skip_spikes=True)` reads its record after a skip and at an epoch's end only.

The guard's record is device arrays passed from step to step; the host reads it through
`GuardRun.read_spikes` (the flag it polls is a count of skips, read once computed, never
waited for). Counted here around a clean run and one with a planted spike.
"""

from test_spike_skipping import fit_with_a_fault
from kgrad.backends.jax.guard.run import GuardRun

STEPS_PER_EPOCH, EPOCHS = 30, 2


def _fit(monkeypatch, fault_step=None):
    calls = []
    original = GuardRun.read_spikes

    def read_spikes(self, optimizer):
        calls.append(self.steps_run_on_device())
        return original(self, optimizer)

    monkeypatch.setattr(GuardRun, "read_spikes", read_spikes)
    monkeypatch.setattr(
        GuardRun, "steps_run_on_device", lambda self: int(self.record.spikes.row_count), raising=False
    )
    guard = fit_with_a_fault([], STEPS_PER_EPOCH, EPOCHS, fault_step)
    return guard, calls


def test_a_clean_run_reads_the_record_at_each_epochs_end_only(monkeypatch):
    guard, calls = _fit(monkeypatch)
    assert guard.skipped_steps == []
    assert calls == [STEPS_PER_EPOCH * (epoch + 1) for epoch in range(EPOCHS)]


def test_a_skipped_step_is_read_once_more(monkeypatch):
    guard, calls = _fit(monkeypatch, fault_step=20)
    # The faulty batch comes back in the second epoch: skipped again.
    assert [s.step for s in guard.skipped_steps] == [20, STEPS_PER_EPOCH + 20]
    # After each skip (once its count was computed), and at each epoch's end.
    assert len(calls) == 2 * EPOCHS and calls[1] == STEPS_PER_EPOCH and calls[3] == 2 * STEPS_PER_EPOCH
    assert 20 < calls[0] <= STEPS_PER_EPOCH and STEPS_PER_EPOCH + 20 < calls[2] <= 2 * STEPS_PER_EPOCH
