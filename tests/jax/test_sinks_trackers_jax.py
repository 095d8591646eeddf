"""W&B (offline), MLflow (a local store) and JSON Lines on Keras' JAX backend: the same tests as on
TensorFlow (tests/test_sinks_trackers.py), each tracker compared value for value with the event files."""

import pytest

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

from test_sinks_trackers import (  # noqa: E402, F401  (tests/ is on the path: tests/jax/conftest.py)
    guarded,
    test_a_guard_trip_attaches_the_html_report_then_and_at_the_end,
    test_a_guard_trip_reaches_every_sink_with_its_report,
    test_every_record_reaches_every_sink,
    test_json_lines_hold_every_record,
    test_mlflow_metrics_and_histogram_artifacts_hold_every_value,
    test_the_page_wandb_stored_opens_in_chromium_with_every_layer,
    test_the_html_report_is_attached_as_kgrad_report_html_renders_it,
    test_wandb_offline_run_holds_every_tag_step_value_and_histogram,
    tracked,
)
