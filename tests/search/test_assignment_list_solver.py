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
from bisect import bisect_left

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import distir.search.layer_assignment as la
from distir.search.assignment_list_solver import ListSolver, distinct_sorted, seq_sum
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


# -- identical stage rows (the screen on one kind of GPU): the list solver's shortcuts ---------


def uniform_problem(rng: np.random.Generator) -> Problem:
    """Like the screen's on one kind of GPU: every stage the same row (an embedding, equal blocks
    with a little rounding noise or none, a head), one cut cost, memory per stage as a 1F1B
    pipeline holds it (more in flight on early stages) or the same on every stage, a capacity
    that binds or not, or no memory at all."""
    p = int(rng.choice([2, 3, 4, 8, 16]))
    n = int(rng.integers(p, 3 * p + 12))
    block = rng.uniform(1.0, 10.0)
    row = np.full(n, block)
    if rng.random() < 0.3:
        row *= 1.0 + rng.integers(-2, 3, n) * 1e-15  # sums that differ in the last bits
    row[0] = block * rng.uniform(0.001, 0.01)  # embedding
    row[-1] = block * rng.uniform(0.1, 0.6)  # head and loss
    time = np.repeat(row[None, :], p, axis=0)
    comm = np.full((p - 1, n - 1), block * rng.uniform(0.001, 0.02))
    mem = cap = None
    if rng.random() < 0.7:
        inflight = (p - np.arange(p)) if rng.random() < 0.6 else np.ones(p)
        mem = np.outer(inflight, rng.uniform(1.0, 2.0) * np.ones(n)) + 3.0
        cap = mem[:, 1] * (n / p) * rng.uniform(0.6, 2.5)
    return time, int(rng.choice([1, 2, 3, 8, 48])), comm, mem, cap


def _check_uniform(args: Problem, rng: random.Random) -> int:
    """List and numpy solvers of ``args`` answer alike (dp at candidate bounds, the candidates of
    random intervals); returns the candidate values met."""
    small, large = solvers(args)
    assert small.rows.uniform
    first = large.dp(math.inf)
    assert small.dp(math.inf) == first
    lo0 = float(args[0].min(axis=0).max()) - 2 * large.atol
    hi0 = first[2] if first is not None else float(args[0].sum(axis=1).max())
    values = large.listing(lo0, hi0).tolist()
    assert small.listing(lo0, hi0) == values
    assert small.count(lo0, hi0) == large.count(lo0, hi0)
    for mu in [0.0, *values, *(v - large.atol for v in values), *(v + 1.5 * large.atol for v in values)]:
        assert small.dp(mu) == large.dp(mu), (args, mu)
    top = float(args[0].sum(axis=1).max())
    for _ in range(6):
        lo, hi = sorted(rng.uniform(-0.1 * top, 1.1 * top) for _ in range(2))
        assert np.array(small.listing(lo, hi)).tobytes() == large.listing(lo, hi).tobytes()
        assert small.count(lo, hi) == large.count(lo, hi)
        assert small.pivot(lo, hi) == large.pivot(lo, hi)
    assert small.listed == large.listed
    return len(values)


def test_identical_rows_answers_equal_bit_for_bit() -> None:
    """With identical stage rows the list solver lists and counts each distinct segment once and
    finds window starts once for all stages: the same answers as numpy's ``_Solver``."""
    rng, prng = np.random.default_rng(17), random.Random(17)
    met = sum(_check_uniform(uniform_problem(rng), prng) for _ in range(60))
    assert met > 500


def test_identical_rows_whole_searches_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(19)
    cases = [uniform_problem(rng) for _ in range(80)]
    lists = [assign_layers(*a) for a in cases]
    monkeypatch.setattr(la, "SMALL_LAYERS", -1)
    assert [assign_layers(*a) for a in cases] == lists
    assert sum(1 for got in lists if got is None) > 3 and sum(1 for got in lists if got is not None) > 50


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_hypothesis_identical_rows_solvers_agree(data: st.DataObject) -> None:
    """Property: on identical stage rows (integer layer times, so segments tie exactly), the list
    solver's whole search and its answers equal numpy's."""
    n = data.draw(st.integers(2, 14))
    p = data.draw(st.integers(2, min(n, 6)))
    row = [float(data.draw(st.integers(0, 5))) for _ in range(n)]
    time = np.repeat(np.array([row]), p, axis=0)
    comm = np.full((p - 1, n - 1), float(data.draw(st.integers(0, 3))))
    mem = cap = None
    if data.draw(st.booleans()):
        mem = np.array([[float(data.draw(st.integers(0, 4)))] * n for _ in range(p)])
        cap = np.array([float(data.draw(st.integers(0, 3 * n))) for _ in range(p)])
    k = data.draw(st.integers(1, 40))
    inp = la._validate(time, k, comm, mem, cap)
    assert la._search(la._list_solver(inp), inp) == la._search(la._Solver(inp), inp)
    _check_uniform((time, k, comm, mem, cap), random.Random(n * p))


def test_window_starts_and_memory_limits_are_searchsorted() -> None:
    """``Rows.firsts`` (one ``searchsorted`` for all stages, on complex keys when rows differ)
    and the per-stage memory limits (likewise) equal ``bisect`` on each stage's row."""
    rng = np.random.default_rng(23)
    for args in [*instances(29, 60), *(uniform_problem(rng) for _ in range(30))]:
        time = args[0]
        small, large = solvers(args)
        p, n = time.shape
        for thr in (math.inf, 0.0, *rng.uniform(0.0, float(time.sum(axis=1).max()), 5)):
            got = small.rows.firsts(float(thr))
            for j in range(p):
                pj = small.P_rows[j]
                assert got[j] == [bisect_left(pj, pj[b] - thr, 0, b) for b in range(n + 1)]
        for j in range(p):
            want = np.maximum(large.lo_mem[j], j).tolist()
            assert small.lo_min[j] == want


@pytest.mark.parametrize("seed", range(40))
def test_distinct_sorted_is_np_unique(seed: int) -> None:
    """``distinct_sorted`` gives ``np.unique``'s array bit for bit (the zero of ±0 it keeps
    included): ties, signed zeros, infinities, NaNs, an empty array."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    pool = np.array([0.0, -0.0, 1.5, -2.25, np.inf, -np.inf, 1e-300, 3.0, 3.0 + 1e-15])
    a = np.where(rng.random(n) < 0.5, rng.choice(pool, n), rng.integers(-5, 6, n) / 4.0)
    if seed % 5 == 0 and n:
        a[rng.integers(0, n, 3)] = np.nan
    got, want = distinct_sorted(a.copy()), np.unique(a)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
