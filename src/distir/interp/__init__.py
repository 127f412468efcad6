"""Interpretation of DistIR: the abstract-interpreter loop and its domains (types/shapes,
reference execution, placement), per-rank projection and the lock-step (deadlock) check."""
