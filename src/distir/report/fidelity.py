"""How well predictions match measurements: rank correlation and error statistics (numpy only).

``spearman(x, y)`` is Spearman's rank correlation ρ: the Pearson correlation of the ranks, ties
taking the mean of the ranks they span. ``errors(pred, real)`` is the absolute relative error
``|pred − real| / real`` of each pair, summarised by ``ErrorStats`` (median and max).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


def ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks 1..n of ``x``, ties sharing the mean of their ranks."""
    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="stable")
    r = np.empty(len(a))
    r[order] = np.arange(1, len(a) + 1)
    for v in np.unique(a):
        sel = a == v
        if sel.sum() > 1:
            r[sel] = r[sel].mean()
    return r


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's ρ of two equally long sequences (at least two values each; NaN when either
    is constant)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"spearman needs two sequences of equal length >= 2, got {len(x)} and {len(y)}")
    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float(np.sqrt((rx**2).sum() * (ry**2).sum()))
    return float((rx * ry).sum() / den) if den > 0 else float("nan")


class ErrorStats(NamedTuple):
    """Median and max absolute relative error, as fractions (0.1 = 10%)."""

    median: float
    max: float


def errors(pred: Sequence[float], real: Sequence[float]) -> ErrorStats:
    """``ErrorStats`` of ``|pred − real| / real`` over the pairs (``real`` must be positive)."""
    p, r = np.asarray(pred, dtype=float), np.asarray(real, dtype=float)
    if p.shape != r.shape or p.size == 0 or np.any(r <= 0):
        raise ValueError("errors needs equally many predictions and positive measurements")
    e = np.abs(p - r) / r
    return ErrorStats(float(np.median(e)), float(np.max(e)))
