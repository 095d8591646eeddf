"""Bad trackers on Keras' JAX backend: the same tests as on TensorFlow
(tests/test_sinks_do_not_change_training.py): same weights, complete event files, a warning, the count."""

from test_sinks_do_not_change_training import (  # noqa: F401  (tests/ is on the path: tests/jax/conftest.py)
    fits,
    test_bad_sinks_leave_the_tensorboard_logs_complete,
    test_bad_sinks_leave_the_weights_as_plain_fit_leaves_them,
    test_each_bad_sink_warns_once_then_counts_what_it_lost,
    test_the_end_of_fit_lets_every_sink_go,
    test_the_fit_adds_to_the_users_objects_only_the_models_one_registry,
)
