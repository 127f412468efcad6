"""What the Pareto pictures (``pareto_png``, ``pareto_html``) show: the memory window and which
front points carry a label.

Peak memory spans orders of magnitude across strategies (pure data parallelism of a large model
needs many times a device's memory, a deep pipeline a small share of it), so both pictures draw
it on a log scale, framed by :func:`memory_window`: the region that fits in memory — from the
left end to the capacity line — takes at least ``FIT_SHARE`` of the axis span. Results needing
more than the right end are drawn at that end and counted (the page can zoom out to them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from distir.search.pareto import capacity_line, plottable

# the least share of the (log) memory axis given to the region that fits in memory
FIT_SHARE = 0.5
# padding, as a factor, beyond the smallest and largest memory shown on the log axis
MARGIN = 1.25
# Beyond this many front points the labels overlap whatever the layout; label a spread of them.
MAX_FRONT_LABELS = 24


class MemoryWindow(NamedTuple):
    """The memory axis of a Pareto picture, in bytes, drawn on a log scale."""

    lo: float  # left end
    hi: float  # right end
    fit_hi: float | None  # right end of the region that fits (None: nothing tells)
    beyond: int  # shown results needing more than ``hi`` (drawn at the right end)
    most: float  # the largest peak memory among the shown results


def on_log_axis(r: Mapping[str, Any]) -> bool:
    """Whether ``r`` can be placed on the pictures: finite figures and a positive memory."""
    return plottable(r) and float(r["peak_memory_bytes"]) > 0


def memory_window(results: Sequence[Mapping[str, Any]]) -> MemoryWindow | None:
    """The memory axis for ``results`` (None when none can be placed on a log axis).

    The right end of the fitting region is the capacity line (:func:`capacity_line`), or the
    largest fitting peak if that is further right (devices of different sizes) or if no
    capacity is known. The window spans the shown peaks (and the capacity) padded by
    ``MARGIN``; when something fits and that span would leave the fitting region less than
    ``FIT_SHARE`` of the (log) axis, the right end is pulled in until it has exactly that
    share (but never closer than ``MARGIN`` past the fitting region). When nothing fits the
    window spans everything: how far over capacity the strategies are is then the news.
    """
    shown = [r for r in results if on_log_axis(r)]
    if not shown:
        return None
    mems = [float(r["peak_memory_bytes"]) for r in shown]
    fitting = [m for r, m in zip(shown, mems, strict=True) if bool(r["fits"])]
    cap = capacity_line(results)
    edges = [*([cap[0]] if cap is not None else []), *fitting]
    fit_hi = max(edges) if edges else None
    lo = min(*mems, *([cap[0]] if cap is not None else [])) / MARGIN
    hi = max(*mems, fit_hi or 0.0) * MARGIN
    if fitting and fit_hi is not None:
        pulled = max(lo * (fit_hi / lo) ** (1.0 / FIT_SHARE), fit_hi * MARGIN)
        hi = min(hi, pulled)
    if not hi > lo:  # one value and no capacity: any decade around it
        lo, hi = lo / 10.0, hi * 10.0
    return MemoryWindow(lo, hi, fit_hi, sum(m > hi for m in mems), max(mems))


def fit_share(w: MemoryWindow) -> float:
    """The share of the (log) memory axis from its left end to the end of the fitting region."""
    if w.fit_hi is None:
        return 0.0
    return max(0.0, min(1.0, math.log(w.fit_hi / w.lo) / math.log(w.hi / w.lo)))


def labelled(front: Sequence[int], best: int | None) -> set[int]:
    """Which front points get a strategy label: all, or an even spread (ends and best included)."""
    if len(front) <= MAX_FRONT_LABELS:
        return set(front)
    n = len(front)
    picked = {front[round(k * (n - 1) / (MAX_FRONT_LABELS - 1))] for k in range(MAX_FRONT_LABELS)}
    if best is not None and best in front:
        picked.add(best)
    return picked
