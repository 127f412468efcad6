"""``--explain``'s comparison in words (``distir.report.search_report.compare``)."""

from __future__ import annotations

from typing import Any

from distir.report.search_report import GIB, compare


def _row(step: float, compute: float, comm: float, bubble: float, fits: bool = True) -> dict[str, Any]:
    return {
        "step_time_s": step,
        "compute_s": compute,
        "comm_s": comm,
        "bubble_fraction": bubble / step,
        "fits": fits,
        "peak_memory_bytes": 90 * GIB,
        "capacity_bytes": 80 * GIB,
    }


def test_a_slower_strategy_is_slower_and_names_the_main_difference() -> None:
    best = _row(1.00, 0.70, 0.20, 0.10)
    other = _row(1.05, 0.70, 0.28, 0.07)
    text = compare(best, other)
    assert text.startswith("1.05× slower than the winner, mostly communication (+80")
    assert "faster" not in text


def test_a_faster_strategy_that_does_not_fit_says_so() -> None:
    best = _row(1.00, 0.70, 0.20, 0.10)
    other = _row(0.95, 0.62, 0.23, 0.10, fits=False)
    text = compare(best, other)
    assert text.startswith("1.05× faster than the winner, mostly compute (−80")
    assert text.endswith("but it does not fit in memory (peak 90.0 of 80 GiB)")
    assert "0.95×" not in text
