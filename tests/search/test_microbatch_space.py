"""The space people train in: every microbatch size for every p (FSDP/ZeRO-3 with gradient
accumulation and no pipeline is in it), HSDP where a stage's replicas span more than a node,
pins of any subset of the strategy's parts, and the best of each pinned shape simulated."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.hardware.cluster import parse_cluster
from distir.parallel.strategy import Strategy, parse_strategy
from distir.search.rerank import ExactJob, evaluate
from distir.search.run import SearchRequest, pick_exact, search
from distir.search.screen import Estimate
from distir.search.space import Pins, Space

# four huge blocks, a long sequence: model state needs ZeRO-3 over 8 GPUs, activations one
# sample per microbatch, and with two-sample replicas a pipeline's bubble costs more than
# FSDP's gathers (on NVLink)
BIG = "gpt:layers=4,hidden=20480,heads=160,seq=4096,vocab=50304"


@pytest.mark.slow
def test_fsdp_with_gradient_accumulation_at_p1_is_screened_and_wins() -> None:
    out = search(
        SearchRequest(
            model=BIG, cluster="dgx-a100", batch=16, dtype="bf16", precision="mixed", top=4, pins=Pins(tp=1)
        )
    )
    best = out.best()
    assert best is not None and best["fits"]
    s = parse_strategy(best["strategy"])
    assert (s.p, s.zero, s.k > 1, best["microbatch_size"]) == (1, 3, True, 1), best["strategy"]
    # it beats the pipelines the search simulated beside it
    piped = [r for r in out.results if r["p"] > 1 and r["fits"]]
    assert piped and all(r["step_time_s"] > best["step_time_s"] for r in piped)
    # without gradient accumulation at p = 1 (the space before): one sample per GPU needs full
    # recomputation to fit, slower than accumulating two one-sample microbatches
    one = [
        e for e in out.screened if e.strategy.p == 1 and e.strategy.d == 8 and e.strategy.k == 1 and e.fits
    ]
    assert one and all(e.strategy.recompute != "none" for e in one)


@pytest.mark.slow
def test_screen_memory_of_zero3_with_accumulation_and_hsdp_follows_the_simulator() -> None:
    """Within the screen's usual tolerance (0.9-1.2 of the exact tensor peak): ZeRO-3 holds the
    running layer's gathered weights beside its working set."""
    from distir.frontends.zoo.registry import parse_model_string
    from distir.ir.types import DType
    from distir.search.profile import Profiler
    from distir.search.screen import Problem, Screen

    cluster = parse_cluster("dgx-a100")
    screen = Screen(
        Profiler(parse_model_string(BIG), cluster, DType.bf16, True, mixed=True),
        Problem(16, True, "adam", True),
    )
    runtime = cluster.device_spec(0).runtime
    job = ExactJob(BIG, "dgx-a100", 16, dtype="bf16", precision="mixed")
    for text in (
        "d8.t1.p1.k2.1f1b.z3",
        "d8.t1.p1.k2.1f1b.z3h4",
        "d4.t2.p1.k4.1f1b.z3h2",
        "d8.t1.p1.k1.1f1b.z3.rsel",
    ):
        est = screen.estimate(parse_strategy(text))
        exact = runtime.tensor_capacity(evaluate(job, text)["peak_memory_bytes"])
        assert 0.9 <= est.peak_memory_bytes / exact <= 1.2, (text, est.peak_memory_bytes / exact)


def test_hsdp_is_in_the_ladder_when_replicas_span_more_than_a_node() -> None:
    sp = Space(16, 64, 8, (1, 2, 4, 8), node_devices=8)
    base = next(b for b in sp.bases() if (b.d, b.t, b.p) == (16, 1, 1))
    zero3 = [s for s in sp.ladder(base) if s.zero == 3]
    # each ZeRO-3 rung first as HSDP over a node's replicas, then over all of them
    assert [s.shard_group for s in zero3] == [8, None] * 3
    inside = next(b for b in sp.bases() if (b.d, b.t, b.p) == (4, 2, 2))  # 8 GPUs per stage
    assert all(s.shard_group is None for s in sp.ladder(inside))
    pinned = Space(16, 64, 8, (1, 2, 4, 8), pins=Pins(hsdp=4), node_devices=8)
    assert {s.shard_group for s in pinned.strategies()} == {4}


# -- pins ------------------------------------------------------------------------------------
# a long sequence: context parallelism (c = 1, 2, 4) is in the space too
SPACE = {
    "devices": 16,
    "batch": 64,
    "n_layers": 6,
    "allowed_tp": (1, 2, 4, 8),
    "node_devices": 8,
    "seq": 16384,
}
PARTS = ("dp", "tp", "pp", "k", "mbs", "schedule", "zero", "recompute", "hsdp", "cp", "sp")


def _value(s: Strategy, part: str) -> object:
    return {
        "dp": s.d,
        "tp": s.t,
        "pp": s.p,
        "k": s.k,
        "mbs": SPACE["batch"] // (s.d * s.k),  # type: ignore[operator]
        "schedule": s.schedule,
        "zero": s.zero,
        "recompute": s.recompute,
        "hsdp": s.shard_group,
        "cp": s.c,
        "sp": s.sp,
    }[part]


ALL = list(Space(**SPACE).strategies())  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ALL), st.sets(st.sampled_from(PARTS)))
def test_any_pinned_subset_searches_exactly_the_rest(s: Strategy, parts: set[str]) -> None:
    """Pinning any subset of the parts to a strategy's values keeps exactly the strategies of the
    unpinned space that agree with the pins (that one among them) — where a pinned schedule takes
    the place of 1F1B at p = 1 (the unpinned space leaves GPipe out there: the same step, more
    memory), a pinned HSDP group adds the ZeRO-3 rungs the unpinned space tries only as plain
    ZeRO-3 (where a stage's replicas fit in a node), and a pinned ZeRO-1 the pipelined ZeRO-1
    rungs the unpinned space leaves to ZeRO-2."""
    if s.shard_group is None:
        parts.discard("hsdp")  # a pin says what is wanted: no pin means "any"
    pins = Pins(**{p: _value(s, p) for p in parts})  # type: ignore[arg-type]
    space = Space(**SPACE, pins=pins)  # type: ignore[arg-type]
    space.check()
    got = set(space.strategies())
    if "schedule" in parts:
        alike = {replace(x, schedule=s.schedule) if x.p == 1 and s.schedule == "gpipe" else x for x in ALL}
    else:
        alike = set(ALL)
    want = {x for x in alike if all(_value(x, p) == _value(s, p) for p in parts)}
    assert s in got and all(all(_value(x, p) == _value(s, p) for p in parts) for x in got)
    if "hsdp" in parts:  # a pinned shard group also applies to the ZeRO-3 rungs of (d, t, p) the
        assert want <= got  # unpinned space leaves to plain ZeRO-3 (replicas within a node)
    elif "zero" in parts and s.zero == 1:  # a pinned ZeRO-1 adds the pipelined ZeRO-1 rungs the
        assert want <= got  # unpinned space leaves to ZeRO-2 (as much memory, less communication)
        assert all(x.p > 1 and x.k > 1 for x in got - want)
    else:
        assert got == want
    for d, t, p, c in {(x.d, x.t, x.p, x.c) for x in got}:
        assert space.why_not(d, t, p, c) is None


def _est(text: str, t: float) -> Estimate:
    return Estimate(parse_strategy(text), t, 1.0, 2.0, True, 0.0, t, 0.0, 0.0, 1.0)


def test_a_pinned_search_simulates_the_best_of_each_shape() -> None:
    """``search --dp 4 --tp 2 --pp 2`` without -k: the screen's favourite k's many variants must
    not crowd out the other microbatch sizes (the screen can misjudge k)."""
    screened = [
        _est("d4.t2.p2.k64.zb1", 1.0),
        _est("d4.t2.p2.k64.1f1b", 1.1),
        _est("d4.t2.p2.k64.interleaved.v2", 1.2),
        _est("d4.t2.p2.k8.zb1", 1.3),
        _est("d4.t2.p2.k8.1f1b", 1.4),
        _est("d4.t2.p2.k16.zb1", 1.5),
    ]
    assert [str(s) for s in pick_exact(screened, 3)] == [str(e.strategy) for e in screened[:3]]
    assert [str(s) for s in pick_exact(screened, 3, by_shape=True)] == [
        "d4.t2.p2.k64.zb1",
        "d4.t2.p2.k8.zb1",
        "d4.t2.p2.k16.zb1",
    ]
    assert Pins(dp=4).pinned and not Pins(max_k=8).pinned and not Pins(cp_from_seq=8192).pinned
    assert {f.name for f in fields(Pins)} == {*PARTS, "max_k", "cp_from_seq"}  # two bounds, not pins


def test_pins_inference_cannot_take_and_microbatch_pins_say_why() -> None:
    import pytest

    from distir.search.space import SpaceError

    for pins in (Pins(zero=1), Pins(recompute="full"), Pins(hsdp=2)):
        with pytest.raises(SpaceError, match="inference keeps no gradients"):
            Space(8, 32, 6, (1, 2, 4, 8), train=False, pins=pins).check()
    with pytest.raises(SpaceError, match="--microbatch-size must be a positive integer"):
        Pins(mbs=0)
    with pytest.raises(SpaceError, match="HSDP shards ZeRO-3"):
        Pins(hsdp=4, zero=2)
    sp = Space(8, 32, 6, (1, 2, 4, 8), pins=Pins(mbs=3))
    assert (sp.why_not(8, 1, 1) or "").startswith("--microbatch-size 3 does not divide")
    # a pinned k beyond --max-microbatches is still searched; unpinned, k stops there
    assert {s.k for s in Space(1, 256, 6, (1,), pins=Pins(k=256, max_k=8)).bases()} == {256}
    assert max(s.k for s in Space(1, 256, 6, (1,), pins=Pins(max_k=8)).bases()) == 8
    # recomputation outside the ladder (torchtitan's op-level) when pinned
    got = {
        (s.zero, s.recompute) for s in Space(8, 32, 6, (1, 2), pins=Pins(recompute="ops", dp=8)).strategies()
    }
    assert got == {(z, "ops") for z in range(4)}
