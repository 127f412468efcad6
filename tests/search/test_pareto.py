"""Pareto front against a brute-force dominance check; the fastest fitting result; the capacity
line. (The pictures of the front: tests/report/test_pareto_png.py and test_pareto_html.py.)"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from distir.search.pareto import GIB, best_fitting, capacity_line, pareto_front


def result(
    strategy: str,
    mem_gib: float,
    thr: float,
    *,
    cap_gib: float = 80.0,
    source: str = "simulated",
    fits: bool | None = None,
) -> dict[str, Any]:
    mem, cap = mem_gib * GIB, cap_gib * GIB
    return {
        "strategy": strategy,
        "d": 2,
        "t": 4,
        "p": 2,
        "k": 8,
        "step_time_s": 64.0 / thr if thr > 0 else math.inf,
        "throughput": thr,
        "mfu": 0.4,
        "peak_memory_bytes": mem,
        "capacity_bytes": cap,
        "fits": mem <= cap if fits is None else fits,
        "bubble_fraction": 0.125,
        "source": source,
    }


def random_results(rng: random.Random, n: int, *, grid: int = 0) -> list[dict[str, Any]]:
    """``grid`` > 0 draws from a few values only, so that ties in either axis (and exact
    duplicates) are common."""

    def draw(hi: float) -> float:
        return rng.randrange(grid) * hi / grid if grid else rng.uniform(0, hi)

    return [
        result(
            f"s{i}",
            draw(120.0),
            draw(5000.0),
            source=rng.choice(["simulated", "screen"]),
        )
        for i in range(n)
    ]


def brute_front(results: list[dict[str, Any]]) -> set[int]:
    """The definition, O(n²): NaN never on the front; j beats i if it dominates it, or ties it
    exactly and comes first."""
    pts = [(float(r["peak_memory_bytes"]), float(r["throughput"])) for r in results]
    out = set()
    for i, (m, t) in enumerate(pts):
        if math.isnan(m) or math.isnan(t):
            continue
        beaten = False
        for j, (mj, tj) in enumerate(pts):
            if j == i or math.isnan(mj) or math.isnan(tj):
                continue
            dominates = mj <= m and tj >= t and (mj < m or tj > t)
            if dominates or (mj == m and tj == t and j < i):
                beaten = True
                break
        if not beaten:
            out.add(i)
    return out


# --- pareto_front ----------------------------------------------------------------------------


@pytest.mark.parametrize("grid", [0, 4, 12])
def test_front_matches_brute_force(grid: int) -> None:
    rng = random.Random(1234 + grid)
    for _ in range(60):
        results = random_results(rng, rng.randrange(0, 40), grid=grid)
        front = pareto_front(results)
        assert set(front) == brute_front(results)
        assert len(front) == len(set(front))
        mems = [results[i]["peak_memory_bytes"] for i in front]
        thrs = [results[i]["throughput"] for i in front]
        assert mems == sorted(mems)
        # on a front, more memory must buy strictly more throughput
        assert all(a < b for a, b in itertools.pairwise(thrs))


def test_front_with_non_finite_values_matches_brute_force() -> None:
    rng = random.Random(7)
    specials = [math.nan, math.inf, -math.inf, 0.0]
    for _ in range(60):
        results = random_results(rng, rng.randrange(1, 25), grid=6)
        for r in rng.sample(results, k=min(4, len(results))):
            key = rng.choice(["peak_memory_bytes", "throughput"])
            r[key] = rng.choice(specials)
        assert set(pareto_front(results)) == brute_front(results)


def test_front_exact_ties_keep_first() -> None:
    results = [
        result("a", 10, 100),
        result("b", 10, 100),  # exact tie with a: dropped
        result("c", 10, 90),  # same memory, less throughput: dominated
        result("d", 20, 100),  # more memory, same throughput: dominated
        result("e", 5, 50),
        result("f", 30, 200),
        result("g", 5, 50),  # exact tie with e: dropped
    ]
    assert pareto_front(results) == [4, 0, 5]


def test_front_nan_is_never_on_it() -> None:
    results = [result("a", 10, math.nan), result("b", math.nan, 10), result("c", 50, 1)]
    assert pareto_front(results) == [2]
    assert pareto_front(results[:2]) == []


def test_best_fitting_and_capacity() -> None:
    results = [
        result("oom", 100, 900),
        result("a", 10, 300),
        result("b", 20, 300),
        result("c", 30, math.nan),
        result("d", 40, math.inf),
    ]
    # first of the tie; the faster one does not fit; non-finite throughput never wins
    assert best_fitting(results) == 1
    assert best_fitting(results[2:]) == 0  # indices are into the slice
    assert best_fitting(results[3:]) is None
    assert best_fitting(results[:1]) is None
    assert best_fitting([]) is None
    assert capacity_line(results) == (80 * GIB, True)
    mixed = [
        result("a", 10, 3, cap_gib=40),
        result("b", 10, 3, cap_gib=80),
        result("c", 1, 1, cap_gib=math.inf),
    ]
    assert capacity_line(mixed) == (40 * GIB, False)
    assert capacity_line([]) is None
