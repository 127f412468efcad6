"""The memory/throughput Pareto front of searched strategies.

A *result* is one ranked strategy as the search reports it: a mapping with at least
``strategy`` (str), ``peak_memory_bytes`` (float, max over devices), ``throughput``
(samples/s) and ``fits`` (bool); optionally ``capacity_bytes`` (smallest device memory among
those used).

* :func:`pareto_front` — indices of the results no other result beats on both axes.
* :func:`best_fitting` — the fastest result that fits.
* :func:`capacity_line` — the memory capacity to draw.

The pictures of it (PNG plot, interactive page) are drawn by ``distir.report.pareto_png`` and
``distir.report.pareto_html``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

GIB = float(1 << 30)


# --- the front -----------------------------------------------------------------------------


def pareto_front(results: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of the results not dominated in (lower ``peak_memory_bytes``, higher ``throughput``).

    Result ``j`` dominates ``i`` when it needs no more memory and delivers no less throughput,
    and is strictly better in at least one of the two. Of several results with exactly equal
    memory and throughput only the first (lowest index) is kept. Results whose memory or
    throughput is NaN are not comparable and are never on the front; infinities compare as
    ordinary numbers. Feasibility (``fits``) is ignored: this is the trade-off curve, the
    capacity line is drawn separately. The indices come sorted by peak memory ascending (which
    on a front is also throughput ascending). O(n log n).
    """
    keyed: list[tuple[float, float, int]] = []
    for i, r in enumerate(results):
        mem, thr = float(r["peak_memory_bytes"]), float(r["throughput"])
        if not (math.isnan(mem) or math.isnan(thr)):
            keyed.append((mem, -thr, i))
    # Sweep by memory ascending, best throughput first among equal memory, then by index: a
    # result is on the front iff it beats the throughput of everything swept before it (all of
    # which need no more memory); an exact tie sweeps after its first occurrence and is dropped.
    keyed.sort()
    front: list[int] = []
    best = -math.inf
    for _, neg_thr, i in keyed:
        thr = -neg_thr
        if not front or thr > best:
            front.append(i)
            best = thr
    return front


def best_fitting(results: Sequence[Mapping[str, Any]]) -> int | None:
    """Index of the highest-throughput result that fits in memory (the first on ties), or None
    when none does. Only finite throughputs count: an infinite or NaN one is a broken figure,
    not a winner (and could not be drawn)."""
    best: int | None = None
    best_thr = -math.inf
    for i, r in enumerate(results):
        thr = float(r["throughput"])
        if bool(r["fits"]) and math.isfinite(thr) and (best is None or thr > best_thr):
            best, best_thr = i, thr
    return best


def capacity_line(results: Sequence[Mapping[str, Any]]) -> tuple[float, bool] | None:
    """Where to draw the memory capacity, in bytes, and whether every result has that capacity.

    When all finite ``capacity_bytes`` agree that value is returned with True; otherwise the
    smallest with False (strategies placed on different devices see different limits). None
    when no result carries a finite capacity.
    """
    caps = [
        float(c) for r in results if (c := r.get("capacity_bytes")) is not None and math.isfinite(float(c))
    ]
    if not caps:
        return None
    lo = min(caps)
    return lo, all(c == lo for c in caps)


def plottable(r: Mapping[str, Any]) -> bool:
    """Whether ``r`` can be placed on a plot: finite memory and throughput."""
    return math.isfinite(float(r["peak_memory_bytes"])) and math.isfinite(float(r["throughput"]))


__all__ = ["GIB", "best_fitting", "capacity_line", "pareto_front", "plottable"]
