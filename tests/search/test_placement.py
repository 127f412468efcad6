"""Megatron placement and annealing over TP-group-preserving placements."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest

from distir.search.placement import PlacementError, anneal_placement, megatron_placement

Placement = tuple[int, ...]


def blocks_of(pl: Placement, size: int) -> list[tuple[int, ...]]:
    return [pl[i : i + size] for i in range(0, len(pl), size)]


def all_block_permutations(start: Placement, size: int) -> list[Placement]:
    """Every placement made of ``start``'s blocks in any slot order (the annealer's search space)."""
    bl = blocks_of(start, size)
    return [tuple(g for b in perm for g in b) for perm in itertools.permutations(bl)]


def pipeline_cost(
    node_speed: list[float], gpus_per_node: int, work: list[float], d: int, t: int
) -> Callable[[Placement], float]:
    """Synthetic step time: stages run at their slowest GPU, replicas split across nodes pay a sync.

    Stage s (d·t consecutive program devices) takes work[s] / (slowest speed among its GPUs); the
    step is the slowest stage plus 1.0 per stage whose GPUs span several nodes.
    """

    def cost(pl: Placement) -> float:
        total = 0.0
        worst = 0.0
        for s, w in enumerate(work):
            gpus = pl[s * d * t : (s + 1) * d * t]
            nodes = {g // gpus_per_node for g in gpus}
            worst = max(worst, w / min(node_speed[n] for n in nodes))
            total += 1.0 if len(nodes) > 1 else 0.0
        return worst + total

    return cost


@pytest.mark.parametrize(("d", "t", "p"), [(1, 1, 1), (2, 2, 2), (4, 2, 1), (1, 8, 2), (3, 1, 5)])
def test_megatron_is_identity_permutation(d: int, t: int, p: int) -> None:
    n = d * t * p
    pl = megatron_placement(n, d, t, p)
    assert pl == tuple(range(n))
    assert sorted(pl) == list(range(n))
    # TP group (s, r) is GPUs s·d·t + r·t .. + t−1: consecutive and aligned to t
    for s, r in itertools.product(range(p), range(d)):
        group = pl[s * d * t + r * t : s * d * t + (r + 1) * t]
        assert list(group) == list(range(group[0], group[0] + t)) and group[0] % t == 0


def test_megatron_rejects_mismatch() -> None:
    with pytest.raises(PlacementError, match=r"n_devices: expected d·t·p = 2·2·2 = 8, got 7"):
        megatron_placement(7, 2, 2, 2)
    with pytest.raises(PlacementError, match="t: expected an int >= 1"):
        megatron_placement(0, 2, 0, 2)


def test_finds_exhaustive_optimum_on_two_speed_nodes() -> None:
    # 8 GPUs: node 0 (GPUs 0-3) twice as fast as node 1 (4-7); stage 0 does twice stage 1's work.
    d = t = p = 2
    cost = pipeline_cost([1.0, 0.5], 4, [2.0, 1.0], d, t)
    start: Placement = (4, 5, 6, 7, 0, 1, 2, 3)  # the heavy stage on the slow node
    space = all_block_permutations(start, t)
    best = min(cost(pl) for pl in space)
    winners = [pl for pl in space if cost(pl) == best]
    # the problem has one optimal grouping: stage 0's replicas on the fast node, in either order
    assert all(set(pl[:4]) == {0, 1, 2, 3} for pl in winners) and len(winners) == 4
    assert cost(start) > best
    pl, c = anneal_placement(d, t, p, cost, start=start, iters=300, seed=0)
    assert c == best == cost(pl)
    assert set(pl[:4]) == {0, 1, 2, 3}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finds_exhaustive_optimum_among_8_blocks(seed: int) -> None:
    # 16 GPUs in 4 nodes of speeds 1..4, p = 4 stages of work 4..1, d = t = 2: 8! block orders
    d, t, p = 2, 2, 4
    cost = pipeline_cost([1.0, 2.0, 3.0, 4.0], 4, [4.0, 3.0, 2.0, 1.0], d, t)
    start = megatron_placement(16, d, t, p)  # heaviest stage on the slowest node
    best = min(cost(pl) for pl in all_block_permutations(start, t))
    assert cost(start) > best
    pl, c = anneal_placement(d, t, p, cost, start=start, iters=2000, seed=seed)
    assert c == pytest.approx(best) and cost(pl) == c
    assert [sorted({g // 4 for g in pl[s * 4 : s * 4 + 4]}) for s in range(p)] == [[3], [2], [1], [0]]


@pytest.mark.parametrize("seed", range(6))
def test_never_worse_than_start_and_cost_consistent(seed: int) -> None:
    rng = random.Random(seed)
    d, t, p = rng.choice([(2, 2, 2), (1, 2, 4), (3, 1, 2), (2, 4, 1)])
    n = d * t * p
    table: dict[Placement, float] = {}

    def cost(pl: Placement) -> float:  # an arbitrary landscape, a quarter of it infeasible
        if pl not in table:
            table[pl] = math.inf if rng.random() < 0.25 else rng.uniform(1.0, 10.0)
        return table[pl]

    start = tuple(rng.sample(range(n), n))
    pl, c = anneal_placement(d, t, p, cost, start=start, iters=200, seed=seed)
    assert c <= cost(start)
    assert c == cost(pl)
    assert sorted(pl) == list(range(n))


@pytest.mark.parametrize(("t", "block"), [(2, None), (4, None), (2, 4), (1, 3)])
def test_blocks_stay_whole(t: int, block: int | None) -> None:
    d, p = 3, 2
    n = d * t * p
    size = t if block is None else block
    start = tuple(random.Random(5).sample(range(n), n))  # blocks of an arbitrary start move intact
    visited: list[Placement] = []

    def cost(pl: Placement) -> float:  # a rugged landscape, so that many swaps are accepted
        visited.append(pl)
        return float(sum(i * g for i, g in enumerate(pl)) % 23) + 1.0

    pl, _ = anneal_placement(d, t, p, cost, start=start, iters=300, seed=1, block=block)
    assert len(set(visited)) >= min(math.factorial(n // size), 10)  # the walk went somewhere
    groups = {frozenset(b) for b in blocks_of(start, t)}
    for q in [*visited, pl]:
        assert sorted(blocks_of(q, size)) == sorted(blocks_of(start, size))
        if size % t == 0:  # each TP group's GPUs come from one TP group of the start
            assert all(frozenset(b) in groups for b in blocks_of(q, t))


def test_deterministic_for_a_seed() -> None:
    d, t, p = 2, 2, 3
    calls: list[Placement] = []

    def cost(pl: Placement) -> float:
        calls.append(pl)
        return float(sum((i % 5) * g for i, g in enumerate(pl)) % 17) + 1.0

    runs = []
    for _ in range(2):
        calls.clear()
        runs.append((anneal_placement(d, t, p, cost, iters=400, seed=3), list(calls)))
    assert runs[0] == runs[1]
    calls.clear()
    anneal_placement(d, t, p, cost, iters=400, seed=4)
    assert calls != runs[0][1]  # the seed does drive the walk


def test_infeasible_start_reaches_feasible() -> None:
    d = t = p = 2
    base = pipeline_cost([1.0, 0.5], 4, [2.0, 1.0], d, t)

    def cost(pl: Placement) -> float:  # stage 0 must sit on node 0
        return base(pl) if set(pl[:4]) == {0, 1, 2, 3} else math.inf

    pl, c = anneal_placement(d, t, p, cost, start=(4, 5, 6, 7, 0, 1, 2, 3), iters=200, seed=0)
    assert math.isfinite(c) and c == cost(pl)


def _rugged(calls: list[Placement]) -> Callable[[Placement], float]:
    def cost(pl: Placement) -> float:
        calls.append(pl)
        return float(sum((i % 7) * g for i, g in enumerate(pl)) % 29) + 1.0

    return cost


@pytest.mark.parametrize("seed", range(4))
def test_patience_ends_the_walk_once_nothing_better_turns_up(seed: int) -> None:
    """With ``patience``, the walk is the full walk's first steps: it stops ``patience`` steps
    after the last improvement of the best, with the best the full walk had found by then."""
    d, t, p = 2, 1, 4
    full_calls: list[Placement] = []
    full = anneal_placement(d, t, p, _rugged(full_calls), iters=400, seed=seed)
    calls: list[Placement] = []
    got = anneal_placement(d, t, p, _rugged(calls), iters=400, seed=seed, patience=20)
    assert calls == full_calls[: len(calls)]  # the same walk, cut short
    assert len(calls) < len(full_calls)
    costs = [_rugged([])(pl) for pl in calls]
    last = min(range(len(costs)), key=lambda j: (costs[j], j))  # where the best was found
    assert got == (calls[last], costs[last])
    assert got[1] >= full[1]
    assert anneal_placement(d, t, p, _rugged([]), iters=400, seed=seed, patience=None) == full


def test_patience_waits_for_a_feasible_placement() -> None:
    d = t = p = 2
    base = pipeline_cost([1.0, 0.5], 4, [2.0, 1.0], d, t)

    def cost(pl: Placement) -> float:  # stage 0 must sit on node 0
        return base(pl) if set(pl[:4]) == {0, 1, 2, 3} else math.inf

    pl, c = anneal_placement(d, t, p, cost, start=(4, 5, 6, 7, 0, 1, 2, 3), iters=200, seed=0, patience=1)
    assert math.isfinite(c) and c == cost(pl)


def test_single_block_returns_start() -> None:
    calls: list[Placement] = []

    def cost(pl: Placement) -> float:
        calls.append(pl)
        return 3.0

    assert anneal_placement(1, 4, 1, cost, start=(2, 0, 3, 1)) == ((2, 0, 3, 1), 3.0)
    assert calls == [(2, 0, 3, 1)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start": (0, 1, 2)}, r"start: expected 8 = d·t·p devices, got 3"),
        ({"start": (0, 1, 2, 3, 4, 5, 6, 6)}, "start: expected a permutation of 0..7"),
        ({"start": (1, 2, 3, 4, 5, 6, 7, 8)}, "start: expected a permutation of 0..7"),
        ({"block": 3}, "block: expected a divisor of d·t·p = 8, got 3"),
        ({"block": 0}, "block: expected an int >= 1"),
        ({"iters": -1}, "iters: expected an int >= 0"),
        ({"patience": 0}, r"patience: expected None or an int >= 1, got 0"),
        ({"patience": True}, "patience: expected None or an int >= 1"),
    ],
)
def test_invalid_inputs_raise(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(PlacementError, match=match):
        anneal_placement(2, 2, 2, lambda pl: 1.0, **kwargs)  # type: ignore[arg-type]
    assert issubclass(PlacementError, ValueError)


def test_bad_degrees_and_nan_cost_raise() -> None:
    with pytest.raises(PlacementError, match="d: expected an int >= 1"):
        anneal_placement(0, 2, 2, lambda pl: 1.0)
    with pytest.raises(PlacementError, match="cost: returned NaN"):
        anneal_placement(2, 2, 2, lambda pl: math.nan)
