"""Batch shares for data-parallel replicas on GPUs of different speeds: a faster replica takes a
larger share of every microbatch (``Strategy.shares``).

``propose_shares`` sizes the shares from what the screen already knows: each replica's
per-microbatch time at the even split (its TP groups' layer profiles, summed over its stages'
layers), a share inversely proportional to it, rounded to small integers whose sum divides the
microbatch. Each rounding is screened; the best is proposed only if the screen says it beats the
even split. The exact simulation still decides (``distir.search.rerank``). ``add_shares`` is the
search's step (``distir.search.run``): proposals for the best screened strategies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace

from distir.parallel.distribute import uniform_counts
from distir.parallel.pipeline.partition import call_counts
from distir.parallel.strategy import Strategy
from distir.search.profile import Wanted
from distir.search.screen import Estimate, Screen, rank_key

MAX_SUM_PER_REPLICA = 4  # shares sum to at most 4·d: few distinct microbatches to profile
SHARES_TOP = 8  # strategies whose batch shares the search proposes (``add_shares``)
# ... among those within this factor of the best screened step: shares shorten a mixed group's
# compute by the speed ratio of its GPU kinds at most (2-3x for V100 vs T4), not its communication
SHARES_REACH = 2.0


def replica_times(screen: Screen, even: Estimate, placement: Sequence[int]) -> list[float]:
    """Per data-parallel replica of ``even.strategy`` (no shares, its partition as the screen
    chose it) on ``placement``: one microbatch's time through its stages at the even split, from
    its own TP groups' layer profiles (forward and, training, backward)."""
    s = even.strategy
    b = screen.problem.batch // (s.d * s.k)
    stages = screen.stage_gpus(s, placement)
    fb = 1.0 if screen.problem.train else 0.0
    # the layers of each stage: its chunks j, j + p, … of the partition
    first = screen.profiler.layers(s.t, b, stages[0][: s.t], s.recompute, s.sp)
    e = screen.ends
    blocks = (
        s.partition
        if isinstance(s.partition, tuple)
        else uniform_counts(len(first) - e.pre - e.post, s.chunks)
    )
    counts = call_counts(blocks, e)
    bounds = [0]
    for n in counts:
        bounds.append(bounds[-1] + n)
    times: list[float] = []
    for r in range(s.d):
        total = 0.0
        for c in range(s.chunks):
            group = stages[c % s.p][r * s.t : (r + 1) * s.t]
            prof = screen.profiler.layers(s.t, b, group, s.recompute, s.sp)
            total += sum(p.fwd_s + fb * p.bwd_s for p in prof[bounds[c] : bounds[c + 1]])
        times.append(total)
    return times


def round_shares(weights: Sequence[float], total: int) -> tuple[int, ...] | None:
    """Positive integers summing to ``total``, as nearly proportional to ``weights`` as largest
    remainders make them (ties to the lower index); None if ``total`` < len(weights)."""
    n = len(weights)
    if total < n:
        return None
    # one each up front (every replica takes part), the rest by largest remainder
    ideal = [total * w / sum(weights) for w in weights]
    base = [max(1, int(x)) for x in ideal]
    while sum(base) > total:  # the ones given up front overshoot: take from the least deserving
        i = min((i for i in range(n) if base[i] > 1), key=lambda i: (ideal[i] - base[i], -i))
        base[i] -= 1
    order = sorted(range(n), key=lambda i: (-(ideal[i] - base[i]), i))
    for i in order[: total - sum(base)]:
        base[i] += 1
    return tuple(base)


def mixed_replicas(screen: Screen, s: Strategy, placement: Sequence[int]) -> bool:
    """Whether some stage's replicas differ in the kinds of their GPUs."""
    kinds = screen.kinds
    for gpus in screen.stage_gpus(s, placement):
        reps = {tuple(kinds[g] for g in gpus[r * s.t : (r + 1) * s.t]) for r in range(s.d)}
        if len(reps) > 1:
            return True
    return False


@dataclass(frozen=True, slots=True)
class Candidates:
    """The batch shares ``best_shares`` screens for a strategy on a placement (``candidates``)."""

    base: Strategy  # the strategy without shares, placement or pinned layer counts
    placement: tuple[int, ...]
    even: Estimate  # the even split's
    shares: tuple[tuple[int, ...], ...]  # distinct, in lowest terms, not even


def candidates(screen: Screen, s: Strategy, placement: Sequence[int]) -> Candidates | None:
    """The shares worth screening for ``s`` on ``placement`` (``best_shares``), None if none."""
    if s.d < 2 or s.zero:
        return None
    part = "uniform" if isinstance(s.partition, tuple) else s.partition
    base = replace(s, shares=None, partition=part, placement=None)
    pl = tuple(placement)
    if not mixed_replicas(screen, base, pl):
        return None
    try:
        even = screen.estimate(base, pl)
    except ValueError:
        return None
    times = replica_times(screen, even, pl)
    if min(times) <= 0:
        return None
    mb = screen.problem.batch // s.k
    seen: dict[tuple[int, ...], None] = {}
    for w in range(s.d, MAX_SUM_PER_REPLICA * s.d + 1):
        sh = round_shares([1.0 / t for t in times], w) if mb % w == 0 else None
        got = None if sh is None else replace(base, shares=sh).shares  # lowest terms, None if even
        if got is not None:
            seen.setdefault(got, None)  # another W may give the same split
    return Candidates(base, pl, even, tuple(seen)) if seen else None


def wanted_profiles(screen: Screen, c: Candidates) -> Iterator[Wanted]:
    """The layer profiles screening ``c`` asks for, for
    ``Profiler.prefetch``: each replica's group in each stage at its share of the microbatch."""
    s = c.base
    mb = screen.problem.batch // s.k
    stages = screen.stage_gpus(s, c.placement)
    for sh in c.shares:
        unit = mb // sum(sh)
        for gpus in stages:
            for r in range(s.d):
                yield Wanted(s.t, unit * sh[r], s.recompute, gpus[r * s.t : (r + 1) * s.t], s.sp)


def best_of(screen: Screen, c: Candidates) -> Estimate | None:
    """The best screened of ``c``'s shares (fitting, then fastest; ties: the first), if it fits
    whenever the even split fits and is strictly faster; else None."""
    best: Estimate | None = None
    for sh in c.shares:
        try:
            e = screen.estimate(replace(c.base, shares=sh), c.placement)
        except ValueError:
            continue
        if best is None or rank_key(e) < rank_key(best):
            best = e
    even = c.even
    if best is None or (even.fits and not best.fits) or best.step_time_s >= even.step_time_s:
        return None
    return best


def propose_shares(screen: Screen, s: Strategy, placement: Sequence[int]) -> Strategy | None:
    """The strategy of ``best_shares``, if any."""
    e = best_shares(screen, s, placement)
    return None if e is None else e.strategy


def best_shares(screen: Screen, s: Strategy, placement: Sequence[int]) -> Estimate | None:
    """The screen's best batch shares for ``s`` (its shares ignored; layers re-balanced unless
    ``s`` pins its partition by mode) on ``placement``, if it beats the even split; else None.

    None also when shares cannot help or apply: d = 1, ZeRO, no stage whose replicas differ in
    GPU kinds (``mixed_replicas``), or a batch that does not split evenly (there is no even split
    to beat). Candidates (``candidates``): for each sum W of shares from d to 4·d that divides the
    microbatch B/k, the shares ∝ 1/(replica time at the even split, ``replica_times``) rounded to
    integers ≥ 1 summing to W (``round_shares``); each screened, the fitting and fastest kept
    (ties: the first, i.e. smallest W). It must fit if the even split fits, and be strictly
    faster (``best_of``). Deterministic. Returns its estimate (its strategy carries the shares
    and ``placement``)."""
    c = candidates(screen, s, placement)
    return None if c is None else best_of(screen, c)


def add_shares(
    screen: Screen, screened: list[Estimate], n: int = SHARES_TOP, pool: Executor | None = None
) -> int:
    """Batch shares for the ``n`` best fitting screened strategies (``screened`` sorted by
    ``rank_key``), within ``SHARES_REACH`` of the best, that can take them and may gain (d > 1, no
    ZeRO, no shares yet, a stage whose replicas differ in GPU kinds: ``mixed_replicas``), each on
    its own placement: the proposals the screen finds faster than their even split join
    ``screened``, in place, unless already there; the list is re-sorted best first. With a
    ``pool``, the layer profiles at the new microbatch sizes are computed there first (the costly
    part); the proposals are the same. Returns how many joined."""
    cands: list[Candidates] = []
    best = next((e.step_time_s for e in screened if e.fits), None)
    for e in screened:
        s = e.strategy
        if len(cands) >= n or best is None or e.step_time_s > SHARES_REACH * best:
            break  # (sorted best first) shares cannot bring it near the best
        if (
            e.fits
            and s.d > 1
            and s.c == 1
            and not s.zero
            and s.shares is None
            and mixed_replicas(screen, s, s.gpus)
        ):
            c = candidates(screen, s, s.gpus)
            if c is not None:
                cands.append(c)
    if pool is not None:
        screen.profiler.prefetch(pool, (w for c in cands for w in wanted_profiles(screen, c)))
    have = {e.strategy for e in screened}
    added = 0
    for c in cands:
        got = best_of(screen, c)
        if got is not None and got.strategy not in have:
            have.add(got.strategy)
            screened.append(got)
            added += 1
    screened.sort(key=rank_key)  # stable: the proposals land after equal estimates
    return added


__all__ = [
    "SHARES_REACH",
    "SHARES_TOP",
    "Candidates",
    "add_shares",
    "best_of",
    "best_shares",
    "candidates",
    "mixed_replicas",
    "propose_shares",
    "replica_times",
    "round_shares",
    "wanted_profiles",
]
