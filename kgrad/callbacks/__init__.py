"""Keras callbacks of kgrad, one per module."""
