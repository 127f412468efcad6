"""Batch shares (uneven data parallelism) in the screen and their proposal
(``distir.search.shares``): even shares are the even split, a faster replica taking more of the
batch is faster, the proposal finds that and only where GPUs differ, and an indivisible batch is
refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.parallel.strategy import Strategy, parse_strategy
from distir.search.profile import Profiler
from distir.search.screen import Estimate, Problem, Screen, rank_key
from distir.search.shares import (
    add_shares,
    best_of,
    best_shares,
    candidates,
    propose_shares,
    round_shares,
    wanted_profiles,
)

MODEL = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=512"
MIXED = "p3.8xlarge:1+g4dn.12xlarge:1"  # 4 V100 (GPUs 0-3), then 4 T4 (GPUs 4-7)
EVEN = Strategy(d=2, t=4, p=1, k=2)  # replica 0 on the V100 node, replica 1 on the T4 node


def _screen(cluster: str = MIXED, batch: int = 48) -> Screen:
    return Screen(Profiler(parse_model_string(MODEL), parse_cluster(cluster)), Problem(batch))


def _figures(e: Estimate) -> tuple[object, ...]:
    return (e.step_time_s, e.peak_memory_bytes, e.capacity_bytes, e.fits, e.compute_s, e.sync_s)


def test_equal_shares_are_the_even_split() -> None:
    s = Strategy(d=2, t=2, p=2, k=4)
    same = replace(s, shares=(3, 3))
    assert same.shares is None and same == s
    pl = (4, 5, 0, 1, 6, 7, 2, 3)  # stage 0 mixes a T4 and a V100 replica
    # a screen that has seen uneven shares of s says what a fresh one says of the even split
    seen = _screen()
    seen.estimate(replace(s, shares=(2, 1)), pl)
    assert _figures(seen.estimate(same, pl)) == _figures(_screen().estimate(s, pl))


def test_larger_share_on_the_faster_replica_is_faster() -> None:
    sc = _screen()
    even = sc.estimate(EVEN)
    more_v100 = sc.estimate(replace(EVEN, shares=(2, 1)))
    more_t4 = sc.estimate(replace(EVEN, shares=(1, 2)))
    assert more_v100.strategy.shares == (2, 1)
    assert more_v100.step_time_s < even.step_time_s < more_t4.step_time_s
    # the larger share holds more activations
    assert more_v100.peak_memory_bytes > even.peak_memory_bytes


def test_proposal_favours_the_faster_replica() -> None:
    sc = _screen()
    got = propose_shares(sc, EVEN, tuple(range(8)))
    assert got is not None and got.shares is not None
    assert got.shares[0] > got.shares[1]
    assert (48 // EVEN.k) % sum(got.shares) == 0
    assert sc.estimate(got).step_time_s < sc.estimate(EVEN).step_time_s
    # the V100 replica on the T4 node: the proposal mirrors
    swapped = propose_shares(sc, EVEN, (4, 5, 6, 7, 0, 1, 2, 3))
    assert swapped is not None and swapped.shares == got.shares[::-1]


def test_no_proposal_without_mixed_replicas() -> None:
    assert propose_shares(_screen("p3.8xlarge:2"), EVEN, tuple(range(8))) is None
    # mixed cluster, but each stage's replicas on alike GPUs: stage 0 V100, stage 1 T4
    s = Strategy(d=2, t=2, p=2, k=4)
    assert propose_shares(_screen(), s, tuple(range(8))) is None
    # d = 1 has nothing to share
    assert propose_shares(_screen(), Strategy(d=1, t=4, p=2, k=4), tuple(range(8))) is None


def test_indivisible_batch_is_refused() -> None:
    sc = _screen(batch=48)
    with pytest.raises(ValueError, match="Σshares"):
        sc.estimate(replace(EVEN, shares=(4, 1)))  # 24 per microbatch in 5 shares
    with pytest.raises(ValueError, match="Σshares"):
        sc.estimate(replace(EVEN, k=3, shares=(2, 1)))  # 16 per microbatch in 3 shares
    # 3 per microbatch in 3 shares: one sample and two
    assert sc.estimate(replace(EVEN, k=16, shares=(2, 1))).step_time_s > 0


@pytest.mark.parametrize(
    "text",
    [
        "d2.t4.p1.k4.1f1b.b2-1",
        "d3.t1.p2.k8.gpipe.rfull.L3-1.b1-2-3",
        "d2.t2.sp.p2.k4.1f1b.b3-1.@4-5-6-7-0-1-2-3",
    ],
)
def test_share_strategies_round_trip(text: str) -> None:
    s = parse_strategy(text)
    assert s.shares is not None and str(s) == text and parse_strategy(str(s)) == s


def test_shares_are_in_lowest_terms() -> None:
    assert Strategy(d=2, shares=(4, 2)) == Strategy(d=2, shares=(2, 1))
    assert str(Strategy(d=3, shares=(2, 4, 6))) == "d3.t1.p1.k1.1f1b.b1-2-3"


@pytest.mark.parametrize(
    ("weights", "total"), [([2.0, 1.0], 3), ([10.0, 1.0], 4), ([3.0, 2.0, 1.0], 7), ([100.0, 1.0, 1.0], 3)]
)
def test_rounded_shares_are_positive_and_sum_to_total(weights: list[float], total: int) -> None:
    got = round_shares(weights, total)
    assert got is not None and sum(got) == total and min(got) >= 1
    # no replica is more than one sample of share off its ideal (beyond the one each is given)
    ideal = [total * w / sum(weights) for w in weights]
    assert all(abs(g - x) < 1 or g == 1 for g, x in zip(got, ideal, strict=True))
    assert round_shares(weights, len(weights) - 1) is None


def test_search_adds_proposals_once_and_keeps_the_order() -> None:
    sc = _screen()
    screened = sorted([sc.estimate(EVEN), sc.estimate(Strategy(d=1, t=4, p=2, k=2))], key=rank_key)
    assert add_shares(sc, screened) == 1
    assert any(e.strategy.shares is not None for e in screened)
    assert screened == sorted(screened, key=rank_key)
    assert add_shares(sc, screened) == 0  # already there
    assert len(screened) == 3
    best = best_shares(sc, EVEN, tuple(range(8)))
    assert best is not None and best in screened


def test_wanted_profiles_are_all_the_screen_asks_for() -> None:
    """``add_shares`` prefetches ``wanted_profiles``: with them known, screening the candidates
    simulates no layer."""
    sc = _screen()
    s, pl = Strategy(d=4, t=2, p=1, k=1), tuple(range(8))
    c = candidates(sc, s, pl)
    assert c is not None and len(c.shares) > 1
    for t, b, recompute, group, sp in wanted_profiles(sc, c):
        sc.profiler.layers(t, b, group, recompute, sp)
    before = sc.profiler.probes
    assert best_of(sc, c) is not None
    assert sc.profiler.probes == before
