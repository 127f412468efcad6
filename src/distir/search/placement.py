"""Device placement: which cluster GPU runs each program device of a (d, t, p) strategy.

Numbering. Cluster GPUs are 0..N−1, node by node. A strategy with data-parallel degree d,
tensor-parallel degree t and pipeline degree p has N = d·t·p program devices, numbered stage by
stage with the tensor rank fastest: program device ``s·d·t + r·t + j`` is stage s, replica r,
tensor rank j. A *placement* is a permutation of 0..N−1: program device i runs on GPU
``placement[i]``.

- ``megatron_placement`` is Megatron-LM's heuristic, the identity: each TP group takes t
  consecutive GPUs starting at a multiple of t, hence lies inside one node whenever t divides the
  GPUs per node; a stage's replicas come next, and stages spread over the nodes last.
- ``anneal_placement`` searches placements by simulated annealing in the spirit of AMP's domino
  tiling: a TP group (t GPUs, the heaviest communicator) is a domino that is never broken; moves
  swap two whole dominoes between (stage, replica) slots — or, a quarter of the time, all the
  dominoes of two stages at once — so on a heterogeneous cluster the search decides which stage
  and replica runs on which kind of GPUs and over which links, while every TP group keeps the GPUs
  it started with.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Final

# Temperature schedule. The first PROBES moves are greedy (improvements kept, others undone) and
# sample the uphill cost changes around the start; T0 = median(uphill) / ln 2 accepts the median
# uphill move with probability 1/2. A fraction of the cost itself is far too cold on heterogeneous
# clusters: the barrier between two good placements is a move or two that splits a stage across
# node kinds. Without a finite uphill probe, T0 = INITIAL_FRACTION × the first finite cost. T then
# decays geometrically to FINAL_RATIO·T0 (tuned on random quadratic-assignment-like costs over
# 8! block orders: colder ends or hotter starts found the exhaustive optimum less often).
PROBES: Final = 16
STAGE_MOVES: Final = 0.25  # share of moves that swap two whole stages (see _move)
INITIAL_FRACTION: Final = 0.1
FINAL_RATIO: Final = 1e-2


class PlacementError(ValueError):
    """Bad degrees, block size, start placement or cost value for a placement search."""


def _degree(name: str, v: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise PlacementError(f"{name}: expected an int >= 1, got {v!r}")
    return v


def megatron_placement(n_devices: int, d: int, t: int, p: int) -> tuple[int, ...]:
    """The identity placement of ``n_devices == d·t·p`` program devices (module docstring)."""
    n = _degree("d", d) * _degree("t", t) * _degree("p", p)
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices != n:
        raise PlacementError(f"n_devices: expected d·t·p = {d}·{t}·{p} = {n}, got {n_devices!r}")
    return tuple(range(n))


def _check_start(start: Sequence[int], n: int) -> list[int]:
    if len(start) != n:
        raise PlacementError(f"start: expected {n} = d·t·p devices, got {len(start)}")
    out = [int(g) for g in start]
    if sorted(out) != list(range(n)):
        raise PlacementError(f"start: expected a permutation of 0..{n - 1}, got {tuple(start)}")
    return out


def _check_sizes(
    d: int, t: int, p: int, block: int | None, iters: int, patience: int | None
) -> tuple[int, int]:
    """``anneal_placement``'s d·t·p and block size, its arguments checked."""
    n = _degree("d", d) * _degree("t", t) * _degree("p", p)
    blk = t if block is None else _degree("block", block)
    if n % blk:
        raise PlacementError(f"block: expected a divisor of d·t·p = {n}, got {blk}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise PlacementError(f"iters: expected an int >= 0, got {iters!r}")
    if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
        raise PlacementError(f"patience: expected None or an int >= 1, got {patience!r}")
    return n, blk


def anneal_placement(
    d: int,
    t: int,
    p: int,
    cost: Callable[[tuple[int, ...]], float],
    *,
    start: tuple[int, ...] | None = None,
    iters: int = 2000,
    seed: int = 0,
    block: int | None = None,
    patience: int | None = None,
) -> tuple[tuple[int, ...], float]:
    """Simulated annealing over placements that keep blocks of program devices together.

    Blocks are the ``block`` (default t) consecutive program devices starting at multiples of
    ``block``; with block = t they are the TP groups, indexed by (stage, replica) slot. Each of
    ``iters`` steps swaps the GPUs of two random blocks (a ``STAGE_MOVES`` share of the steps swaps
    two whole stages instead, when a stage is several blocks); the first ``PROBES`` steps are greedy
    and sample the uphill cost changes to set the initial temperature, the others accept by
    Metropolis at a temperature decaying geometrically (module constants). With ``patience``,
    the walk ends early once that many steps in a row (probes included) found no placement
    cheaper than the best, a finite one (the schedule is not shortened: what is left of it is
    skipped); None walks all ``iters`` steps. ``cost`` is called at most ``iters + 1`` times.

    Contract:
    - returns the best placement seen and its cost, so the cost is never worse than ``start``'s
      (default: ``megatron_placement``) and equals ``cost`` of the returned placement;
    - every block of the result holds exactly the GPUs of some block of ``start`` (in the same
      order), and each of ``start``'s blocks appears once: TP groups are never split when t
      divides ``block``;
    - ``cost`` may return ``math.inf`` (infeasible); it must be a pure function of the placement
      (results are cached per placement) and never NaN. Deterministic for a given ``seed``.
    - with a single block there is nothing to move: ``start`` and its cost are returned.
    """
    n, blk = _check_sizes(d, t, p, block, iters, patience)
    place = _check_start(megatron_placement(n, d, t, p) if start is None else start, n)
    n_blocks = n // blk
    # stage moves: all of a stage's blocks at once, when a stage is several whole blocks
    stage = d * t
    n_stages = p if stage % blk == 0 and stage > blk and p > 1 else 0

    seen: dict[tuple[int, ...], float] = {}  # small spaces are revisited often; cost may be slow

    def evaluate(pl: list[int]) -> float:
        key = tuple(pl)
        c = seen.get(key)
        if c is None:
            c = float(cost(key))
            if math.isnan(c):
                raise PlacementError(f"cost: returned NaN for placement {key}")
            seen[key] = c
        return c

    cur = evaluate(place)
    best, best_cost = tuple(place), cur
    found = 0  # the step that found ``best`` (``patience``)
    if n_blocks == 1 or iters == 0:
        return best, best_cost
    rng = random.Random(seed)
    # probes: greedy swaps (uphill ones undone) whose uphill steps set the temperature scale
    n_probe = min(PROBES, iters, n_blocks * (n_blocks - 1) // 2)
    uphill: list[float] = []
    for step in range(1, n_probe + 1):
        x, y, size = _move(rng, n_blocks, blk, n_stages, stage)
        _swap(place, x, y, size)
        new = evaluate(place)
        if new < cur:
            cur = new
            if new < best_cost:
                best, best_cost, found = tuple(place), new, step
            continue
        if math.isfinite(cur) and math.isfinite(new) and new > cur:
            uphill.append(new - cur)
        _swap(place, x, y, size)
    temp0 = statistics.median(uphill) / math.log(2.0) if uphill else 0.0
    if temp0 == 0.0 and math.isfinite(cur):
        temp0 = INITIAL_FRACTION * abs(cur)
    walk = iters - n_probe
    for i in range(walk):
        if patience is not None and n_probe + i - found >= patience and math.isfinite(best_cost):
            break  # no better placement for ``patience`` steps
        x, y, size = _move(rng, n_blocks, blk, n_stages, stage)
        _swap(place, x, y, size)
        new = evaluate(place)
        if temp0 == 0.0 and math.isfinite(new):
            temp0 = INITIAL_FRACTION * abs(new)  # the start was infeasible: first real cost's scale
        if new <= cur:  # also inf -> inf: a random walk until something feasible turns up
            accept = True
        elif math.isinf(new) or temp0 == 0.0:
            accept = False
        else:
            temp = temp0 * FINAL_RATIO ** (i / max(walk - 1, 1))
            accept = rng.random() < math.exp(-(new - cur) / temp)
        if accept:
            cur = new
            if new < best_cost:
                best, best_cost, found = tuple(place), new, n_probe + i + 1
        else:
            _swap(place, x, y, size)
    return best, best_cost


def _move(rng: random.Random, n_blocks: int, blk: int, n_stages: int, stage: int) -> tuple[int, int, int]:
    """Two distinct aligned ranges to swap, as (index, index, size): blocks, or sometimes stages.

    Moving one stage to other GPUs takes d block swaps whose intermediate placements split the
    stage (slow data-parallel sync, slowest-GPU pace), a barrier single swaps rarely cross; a
    stage swap crosses it in one move and still keeps every block whole.
    """
    if n_stages and rng.random() < STAGE_MOVES:
        x, y = rng.sample(range(n_stages), 2)
        return x, y, stage
    x, y = rng.sample(range(n_blocks), 2)
    return x, y, blk


def _swap(place: list[int], x: int, y: int, size: int) -> None:
    """Exchange ranges x and y (of ``size`` program devices each) of ``place`` in place."""
    a, b = x * size, y * size
    place[a : a + size], place[b : b + size] = place[b : b + size], place[a : a + size]
