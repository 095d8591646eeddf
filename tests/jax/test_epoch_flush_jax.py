"""Records on disk at each epoch's end on Keras' JAX backend (tests/test_epoch_flush.py)."""

from test_epoch_flush import test_records_without_histograms_are_on_disk_at_each_epoch_end  # noqa: F401
