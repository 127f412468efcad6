"""The layer assignment's list solver (``ListSolver``) against numpy's ``_Solver``, answer by answer
and bit for bit, and the unchecked entry points against the checked ones.

Instances are of three families: random ones (integer times half of the time: zeros and ties),
the screen's (identical layers per device kind, slow and fast stages, links, memory limits that
bind), where many assignments tie and the DP's band and backward pruning cut the most, and
near-ties (values a few tolerances apart, which the candidate listing merges or keeps).
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

import distir.search.layer_assignment as la
from distir.search.assignment_list_solver import ListSolver, seq_sum
from distir.search.layer_assignment import (
    SearchStats,
    assign_layers,
    assign_layers_unchecked,
    objective,
    objective_unchecked,
)

Problem = tuple[np.ndarray, int, np.ndarray | None, np.ndarray | None, np.ndarray | None]


def random_problem(rng: np.random.Generator) -> Problem:
    n = int(rng.integers(1, 41))
    p = int(rng.integers(1, min(n, 9) + 1))
    k = int(rng.choice([1, 2, 8, 64]))
    speed = rng.choice([1.0, 2.0, 5.0], size=(p, 1))
    raw = rng.integers(0, 4, (p, n)) if rng.random() < 0.5 else rng.uniform(0.1, 2.0, (p, n))
    time = raw / speed
    comm = rng.uniform(0.0, 1.5, (p - 1, n - 1)) if rng.random() < 0.7 else None
    mem = cap = None
    if rng.random() < 0.5:
        mem = rng.integers(0, 5, (p, n)).astype(float)
        cap = rng.integers(0, 3 * max(1, n // p) + 4, p).astype(float)
    return time, k, comm, mem, cap


def screen_problem(rng: np.random.Generator) -> Problem:
    """Like the screen's: every layer the same on a kind of device (two kinds), links slow
    between nodes, a per-layer memory with a capacity a little above the even share."""
    p = int(rng.choice([2, 4, 8, 16]))
    n = int(rng.choice([p + 3, 24, 27, 40, 64]))
    layer = rng.uniform(1e-3, 2e-3)
    kinds = rng.integers(0, 2, p)
    time = np.repeat(np.where(kinds == 0, layer, layer * 2.3)[:, None], n, axis=1)
    time[:, 0] *= 1.5  # an embedding-like first layer
    comm = np.full((p - 1, n - 1), rng.uniform(1e-5, 1e-4))
    comm[kinds[:-1] != kinds[1:]] *= 20.0  # across nodes
    mem = np.full((p, n), 1.0e9)
    cap = np.full(p, 1.0e9 * (n / p) * rng.uniform(0.9, 2.0))
    return time, int(rng.choice([4, 16, 32])), comm, mem, cap


def near_tie_problem(rng: np.random.Generator) -> Problem:
    """Layers equal up to a few times the search's tolerance (REL_TOL × the largest stage total):
    candidate values closer than it are merged, farther ones kept."""
    n = int(rng.integers(2, 13))
    p = int(rng.integers(1, min(n, 4) + 1))
    time = 1.0 + rng.uniform(0.0, 3.0, (p, n)) * la.REL_TOL * n
    comm = np.full((p - 1, n - 1), 0.5) + rng.uniform(0.0, 3.0, (p - 1, n - 1)) * la.REL_TOL * n
    return time, int(rng.choice([2, 8])), comm, None, None


def solvers(args: Problem) -> tuple[ListSolver, la._Solver]:
    inp = la._validate(*args)
    return la._list_solver(inp), la._Solver(inp)


def instances(seed: int, count: int) -> list[Problem]:
    rng = np.random.default_rng(seed)
    makers = (screen_problem, random_problem, near_tie_problem)
    out = [makers[i % 3](rng) for i in range(count)]
    return [a for a in out if a[0].shape[0] <= a[0].shape[1]]


def test_seq_sum_is_numpy_sum_below_eight() -> None:
    rng = random.Random(5)
    rounding_matters = 0
    for _ in range(5000):
        xs = [rng.random() * 10.0 ** rng.randint(-8, 8) for _ in range(rng.randint(0, 7))]
        got = seq_sum(xs)
        assert np.float64(got).tobytes() == np.array(xs, dtype=np.float64).sum().tobytes()
        rounding_matters += got != math.fsum(xs)
    assert rounding_matters > 500  # the data really tells summation orders apart


@pytest.mark.slow
def test_dp_answers_equal_bit_for_bit() -> None:
    """dp at every candidate bound of the root interval, just below and above it, at 0 and at ∞:
    the same (counts, sum, max) or None, and the same evaluation and infeasibility counts."""
    checked = infeasible = 0
    for args in instances(1, 80):
        small, large = solvers(args)
        first = large.dp(math.inf)
        lo0 = float(args[0].min(axis=0).max()) - 2 * large.atol
        hi0 = first[2] if first is not None else lo0 + 1.0
        values = large.listing(lo0, hi0).tolist()
        mus = [
            math.inf,
            0.0,
            *values,
            *(v - large.atol for v in values),
            *(v + 1.5 * large.atol for v in values),
        ]
        small.dp(math.inf)
        for mu in mus:
            got = small.dp(mu)
            assert got == large.dp(mu), (args, mu)
            checked += 1
            infeasible += got is None
        assert (small.evaluations, small.infeasible) == (large.evaluations, large.infeasible)
    assert checked > 2000 and 200 < infeasible < checked - 200  # both outcomes, many times


def test_candidate_answers_equal_bit_for_bit() -> None:
    """``listing`` (the same array), ``count``, ``pivot`` on random intervals, and ``evaluate``
    on random compositions."""
    rng = random.Random(2)
    listed = 0
    for args in instances(2, 60):
        small, large = solvers(args)
        p, n = args[0].shape
        top = float(
            args[0].sum(axis=1).max() + (args[2].max() if args[2] is not None and args[2].size else 0.0)
        )
        for _ in range(8):
            lo, hi = sorted(rng.uniform(-0.1 * top, 1.1 * top) for _ in range(2))
            want = large.listing(lo, hi)
            got = small.listing(lo, hi)
            assert np.array(got, dtype=np.float64).tobytes() == want.tobytes()
            assert small.count(lo, hi) == large.count(lo, hi)
            assert small.pivot(lo, hi) == large.pivot(lo, hi)
            listed += len(got)
        assert small.listed == large.listed
        for _ in range(10):
            cuts = sorted(rng.sample(range(1, n), p - 1))
            counts = [b - a for a, b in itertools.pairwise([0, *cuts, n])]
            assert small.evaluate(counts) == large.evaluate(counts)
    assert listed > 5000


def test_whole_searches_equal_on_screen_like_problems(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [screen_problem(np.random.default_rng(s)) for s in range(60)]

    def run() -> list[tuple[object, int, int, int]]:
        out = []
        for args in cases:
            st = SearchStats()
            out.append((assign_layers(*args, stats=st), st.evaluations, st.infeasible, st.listed))
        return out

    lists = run()
    monkeypatch.setattr(la, "SMALL_LAYERS", -1)
    assert run() == lists
    assert sum(1 for got, *_ in lists if got is not None) > 40
    assert sum(inf for *_, inf, _ in lists) > 60  # bounds below the optimum were tried


def test_unchecked_entries_equal_checked_ones() -> None:
    for args in instances(3, 80):
        time, k, comm, mem, cap = args
        assert assign_layers_unchecked(time, k, comm, mem, cap) == assign_layers(time, k, comm, mem, cap)
        p, n = time.shape
        counts = [n // p + (1 if j < n % p else 0) for j in range(p)]
        assert objective_unchecked(counts, time, k, comm) == objective(counts, time, k, comm)
