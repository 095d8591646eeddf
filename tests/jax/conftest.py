"""Tests of kgrad on Keras' JAX backend: run with ``KERAS_BACKEND=jax python -m pytest tests/jax``.

Keras picks its backend once per process, so these tests are skipped (with
that reason) in a run on another backend (the repository's conftest.py); the
README's test command runs them in a second process.
"""

# The helpers beside the backend-free tests (a TensorBoard server, the browser).
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
