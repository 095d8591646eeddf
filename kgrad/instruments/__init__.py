"""Instruments computed from a probed step: per-example gradient norms, gradient noise scale."""
