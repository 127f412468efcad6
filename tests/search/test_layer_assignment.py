"""Optimal pipeline layer assignment against an exhaustive reference written independently here."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import distir.search.layer_assignment as la
from distir.search.layer_assignment import (
    LayerAssignmentError,
    SearchStats,
    assign_layers,
    brute_force,
    objective,
)

Matrix = list[list[float]]


def reference(
    time: Matrix, k: int, comm: Matrix | None, mem: Matrix | None, cap: list[float] | None
) -> float | None:
    """Least objective over every composition, with plain-Python sums (shares no code with the module)."""
    p, n = len(time), len(time[0])
    best: float | None = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        b = (0, *cuts, n)
        if (
            mem is not None
            and cap is not None
            and any(sum(mem[j][b[j] : b[j + 1]]) > cap[j] for j in range(p))
        ):
            continue
        stage = [sum(time[j][b[j] : b[j + 1]]) for j in range(p)]
        cut = [comm[j][b[j + 1] - 1] if comm is not None else 0.0 for j in range(p - 1)]
        value = (k - 1) * max(stage + cut) + sum(stage) + sum(cut)
        best = value if best is None else min(best, value)
    return best


def instance(
    rng: np.random.Generator, n: int, p: int, with_comm: bool, with_mem: bool
) -> tuple[Matrix, Matrix | None, Matrix | None, list[float] | None]:
    """Random times on stages of different speeds; integer times half of the time (ties, zeros)."""
    speed = rng.choice([1.0, 2.0, 5.0], size=(p, 1))
    raw = rng.integers(0, 4, (p, n)) if rng.random() < 0.5 else rng.uniform(0.1, 2.0, (p, n))
    time = raw / speed
    comm = rng.uniform(0.0, 1.5, (p - 1, n - 1)).tolist() if with_comm else None
    mem = cap = None
    if with_mem:  # integer bytes: sums are exact, so the reference's `>` is the module's `<=`
        mem = rng.integers(0, 5, (p, n)).astype(float).tolist()
        cap = rng.integers(0, 3 * max(1, n // p) + 4, p).astype(float).tolist()
    return time.tolist(), comm, mem, cap


def check(time: Matrix, k: int, comm: Matrix | None, mem: Matrix | None, cap: list[float] | None) -> bool:
    """Assert assign_layers and brute_force match the reference; True if the instance was feasible."""
    want = reference(time, k, comm, mem, cap)
    got = assign_layers(time, k, comm, mem, cap)
    slow = brute_force(time, k, comm, mem, cap)
    if want is None:
        assert got is None and slow is None
        return False
    assert got is not None and slow is not None
    assert got.time == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert slow.time == pytest.approx(want, rel=1e-9, abs=1e-12)
    p, n = len(time), len(time[0])
    assert len(got.counts) == p and all(c >= 1 for c in got.counts) and sum(got.counts) == n
    # the counts achieve the reported objective, and the reported parts are consistent
    assert objective(got.counts, time, k, comm) == pytest.approx(got.time, rel=1e-12, abs=1e-12)
    assert got.time == pytest.approx((k - 1) * got.max_stage + got.sum_stage, rel=1e-12, abs=1e-12)
    if mem is not None and cap is not None:
        b = [0, *itertools.accumulate(got.counts)]
        assert all(sum(mem[j][b[j] : b[j + 1]]) <= cap[j] for j in range(p))
    return True


@pytest.fixture(params=["lists", "numpy"])
def dp_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the DP on Python lists (small problems) and with numpy (large ones)."""
    if request.param == "numpy":
        monkeypatch.setattr(la, "SMALL_LAYERS", -1)
    return str(request.param)


def test_list_and_numpy_dps_agree_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two implementations of the min-sum DP give the same floats, hence the same search."""
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(150):
        n = int(rng.integers(2, 41))
        p = int(rng.integers(1, min(n, 9) + 1))
        k = int(rng.choice([1, 2, 8, 64]))
        cases.append((instance(rng, n, p, with_comm=rng.random() < 0.7, with_mem=rng.random() < 0.5), k))

    def run() -> list[tuple[object, int, int]]:
        out = []
        for (time, comm, mem, cap), k in cases:
            stats = SearchStats()
            out.append(
                (assign_layers(time, k, comm, mem, cap, stats=stats), stats.evaluations, stats.infeasible)
            )
        return out

    # the DP itself, bound by bound
    for (time, comm, mem, cap), k in cases[:40]:
        inp = la._validate(time, k, comm, mem, cap)
        small, large = la._list_solver(inp), la._Solver(inp)
        for mu in (math.inf, *np.unique(np.asarray(time)).tolist(), 0.0):
            assert small.dp(mu) == large.dp(mu)
    # and whole searches
    lists = run()
    monkeypatch.setattr(la, "SMALL_LAYERS", -1)
    assert run() == lists
    assert sum(1 for got, *_ in lists if got is not None) > 50


def test_matches_exhaustive_reference_on_small_instances(dp_path: str) -> None:
    rng = np.random.default_rng(20240611)
    feasible = infeasible = 0
    for _ in range(600):
        n = int(rng.integers(1, 10))
        p = int(rng.integers(1, 5))
        k = int(rng.integers(1, 65))
        if p > n:
            assert assign_layers(rng.random((p, n)), k) is None
            continue
        args = instance(rng, n, p, with_comm=rng.random() < 0.5, with_mem=rng.random() < 0.5)
        time, comm, mem, cap = args
        if check(time, k, comm, mem, cap):
            feasible += 1
        else:
            infeasible += 1
    # the generator must exercise both outcomes for the comparison to mean something
    assert feasible > 200 and infeasible > 20


def test_matches_reference_on_medium_instances(dp_path: str) -> None:
    # more layers: many candidate values, so the branch and bound really branches
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.integers(12, 23))
        p = int(rng.integers(2, 5))
        k = int(rng.choice([2, 3, 8, 32, 200]))
        time, comm, mem, cap = instance(rng, n, p, with_comm=rng.random() < 0.7, with_mem=rng.random() < 0.4)
        check(time, k, comm, mem, cap)


def test_pivot_path_without_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    # with nothing listed, every split uses the weighted median of row medians
    monkeypatch.setattr(la, "MATERIALIZE_LIMIT", 0)
    rng = np.random.default_rng(11)
    for _ in range(150):
        n = int(rng.integers(2, 10))
        p = int(rng.integers(1, min(n, 4) + 1))
        k = int(rng.integers(2, 40))
        time, comm, mem, cap = instance(rng, n, p, with_comm=rng.random() < 0.5, with_mem=rng.random() < 0.3)
        check(time, k, comm, mem, cap)
    stats = SearchStats()
    assign_layers(rng.uniform(0.1, 1.0, (3, 9)), 16, stats=stats)
    assert stats.listed == 0 and stats.evaluations > 1


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_hypothesis_integer_instances(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 8))
    p = data.draw(st.integers(1, min(n, 4)))
    k = data.draw(st.integers(1, 50))
    num = st.integers(0, 6).map(float)
    time = [[data.draw(num) for _ in range(n)] for _ in range(p)]
    comm = None
    if data.draw(st.booleans()):
        comm = [[data.draw(num) for _ in range(n - 1)] for _ in range(p - 1)]
    mem = cap = None
    if data.draw(st.booleans()):
        mem = [[data.draw(num) for _ in range(n)] for _ in range(p)]
        cap = [data.draw(st.integers(0, 20).map(float)) for _ in range(p)]
    check(time, k, comm, mem, cap)


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("per_stage", [1, 3, 5])
@pytest.mark.parametrize("k", [2, 8])
def test_uniform_layers_give_uniform_split(p: int, per_stage: int, k: int) -> None:
    got = assign_layers(np.ones((p, p * per_stage)), k)
    assert got is not None
    assert got.counts == (per_stage,) * p
    assert got.max_stage == per_stage


def test_faster_stage_takes_more_layers() -> None:
    # 12 unit layers, stage 1 twice as fast: T = (c, (12−c)/2); c = 4 balances at 4 and is the
    # unique optimum for k = 8 ((k−1)·max + sum is 36 there, ≥ 39 for c = 3 or 5)
    time = np.vstack([np.ones(12), np.full(12, 0.5)])
    got = assign_layers(time, 8)
    assert got is not None and got.counts == (4, 8)
    assert got.time == pytest.approx(7 * 4 + 8)


def test_link_can_be_the_bottleneck() -> None:
    # every link is slow but the one after the second layer: the optimum cuts there, unevenly
    time = np.ones((2, 6))
    comm = np.full((1, 5), 10.0)
    comm[0, 1] = 0.5
    got = assign_layers(time, 4, comm)
    assert got is not None and got.counts == (2, 4)
    assert got.max_stage == 4.0 and got.sum_stage == 6.5


def test_infeasible_cases() -> None:
    assert assign_layers(np.ones((4, 3)), 2) is None  # more stages than layers
    assert brute_force(np.ones((4, 3)), 2) is None
    mem = np.ones((2, 6))
    assert assign_layers(np.ones((2, 6)), 2, None, mem, np.array([2.0, 3.0])) is None  # 5 < 6 bytes
    got = assign_layers(np.ones((2, 6)), 2, None, mem, np.array([2.0, math.inf]))
    assert got is not None and got.counts[0] <= 2
    assert assign_layers(np.ones((2, 6)), 2, None, mem, np.array([-1.0, 10.0])) is None


def test_k_one_minimizes_the_sum() -> None:
    time = np.array([[1.0, 1.0, 1.0, 1.0], [0.1, 0.1, 0.1, 0.1]])
    got = assign_layers(time, 1)
    assert got is not None and got.counts == (1, 3)
    assert got.time == pytest.approx(1.3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"time": np.ones(5)}, r"time: expected shape \(p, L\)"),
        ({"time": np.ones((2, 0))}, r"time: expected shape \(p, L\)"),
        ({"time": -np.ones((2, 5))}, "time: contains a negative"),
        ({"time": np.full((2, 5), np.nan)}, "time: contains NaN"),
        ({"time": np.full((2, 5), np.inf)}, "time: contains an infinite"),
        ({"k": 0}, "k: expected an int >= 1"),
        ({"k": 2.0}, "k: expected an int >= 1"),
        ({"k": True}, "k: expected an int >= 1"),
        ({"comm": np.ones((2, 4))}, r"comm: expected shape \(1, 4\), got \(2, 4\)"),
        ({"comm": np.ones((1, 5))}, r"comm: expected shape \(1, 4\), got \(1, 5\)"),
        ({"mem": np.ones((2, 4)), "cap": np.ones(2)}, r"mem: expected shape \(2, 5\), got \(2, 4\)"),
        ({"mem": np.ones((2, 5)), "cap": np.ones(3)}, r"cap: expected shape \(2,\), got \(3,\)"),
        ({"mem": np.ones((2, 5))}, "mem and cap"),
        ({"cap": np.ones(2)}, "mem and cap"),
        ({"mem": np.ones((2, 5)), "cap": np.array([1.0, np.nan])}, "cap: contains NaN"),
    ],
)
def test_invalid_inputs_raise(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"time": np.ones((2, 5)), "k": 4}
    args.update(kwargs)
    for fn in (assign_layers, brute_force):
        with pytest.raises(LayerAssignmentError, match=match):
            fn(**args)  # type: ignore[arg-type]


def test_objective_checks_counts() -> None:
    time = np.ones((2, 5))
    assert objective((2, 3), time, 3) == pytest.approx(2 * 3 + 5)
    with pytest.raises(LayerAssignmentError, match="counts: expected a sum of 5"):
        objective((2, 2), time, 3)
    with pytest.raises(LayerAssignmentError, match="counts: expected 2 stages"):
        objective((5,), time, 3)
    with pytest.raises(LayerAssignmentError, match="counts: expected positive ints"):
        objective((0, 5), time, 3)
    assert issubclass(LayerAssignmentError, ValueError)
