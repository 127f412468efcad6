"""DeepSpeed ZeRO-3's module-by-module fetch (``distir.parallel.zero3_fetch``,
``distribute(zero3_fetch=...)``): the coordinator's plan checked by hand on a small trace (the
prefetch bucket, the live-parameter cap, the reuse distance, persistence) and as properties on
random traces; the distributed step with it trains as the sequential step; the program's gathers
are the plan's calls; the live cap and the release rule bound the gathered bytes in the simulated
peak; the gradient buckets follow DeepSpeed's rule."""

from __future__ import annotations

import random

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Module
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.parallel.zero3_fetch import (
    FetchSpecError,
    FetchStep,
    Zero3Fetch,
    parse_zero3_fetch,
    plan_fetches,
)
from distir.sim.simulate import simulate

from .helpers import assert_mixed_step_matches

# a hand trace: weights 0..2 of 100 elements, 9 a persistent one of 5
NUMEL = {0: 100, 1: 100, 2: 100, 9: 5}
PERSIST = frozenset({9})


def test_the_bucket_rule_by_hand() -> None:
    """Trace [9], [0], [9], [1], [2], [0]; bucket 150, cap 250, reuse 150. Step 0 (the norm):
    nothing to fetch; its prefetch pops 0 (100 < 150 goes on), 9 (105), 1 (205 ≥ 150 stops): one
    call for 0 and 1 (9 is whole). Step 1 (0): already in flight; budget min(250 − 200, 150) =
    50: pops 2 (100 ≥ 50). 0's next use (step 5) lies past 205 walked elements (> 150):
    released. Step 2 (the norm): budget 50 pops step 5's entry, 0, gathered again — the prefetch
    follows the queue, not the release. Steps 3 and 4: nothing left to pop; 1 and 2 released.
    Step 5: 0 is there."""
    cfg = Zero3Fetch(prefetch_bucket=150, max_live=250, max_reuse=150, persistence=10)
    plan = plan_fetches([[9], [0], [9], [1], [2], [0]], NUMEL, PERSIST, cfg)
    assert plan == [
        FetchStep((), (0, 1), (), 200),
        FetchStep((), (2,), (0,), 300),
        FetchStep((), (0,), (), 300),
        FetchStep((), (), (1,), 300),
        FetchStep((), (), (2,), 200),
        FetchStep((), (), (0,), 100),
    ]


def test_the_reuse_distance_keeps_a_weight_used_again_soon() -> None:
    """With a reuse distance of 250 elements, 0 is met again within it (steps 2..4 walk 205
    elements before step 5): kept, never gathered twice."""
    cfg = Zero3Fetch(prefetch_bucket=150, max_live=250, max_reuse=250, persistence=10)
    plan = plan_fetches([[9], [0], [9], [1], [2], [0]], NUMEL, PERSIST, cfg)
    gathered = [k for s in plan for k in (*s.fetch, *s.prefetch)]
    assert gathered.count(0) == 1
    assert plan[1].release == () and plan[5].release == (0,)


def test_a_module_not_prefetched_is_fetched_on_the_spot() -> None:
    """No prefetch bucket: each module gathers its own weights right before it runs."""
    cfg = Zero3Fetch(prefetch_bucket=0, max_live=250, max_reuse=0, persistence=10)
    plan = plan_fetches([[0], [1], [0]], NUMEL, PERSIST, cfg)
    assert [s.fetch for s in plan] == [(0,), (1,), (0,)]


def test_no_prefetch_fetches_every_module_on_the_spot() -> None:
    cfg = Zero3Fetch(prefetch_bucket=0, max_live=10**9, max_reuse=0, persistence=10)
    plan = plan_fetches([[0], [1], [2], [0]], NUMEL, PERSIST, cfg)
    assert [s.fetch for s in plan] == [(0,), (1,), (2,), (0,)]
    assert all(s.prefetch == () for s in plan)


def _random_case(rng: random.Random) -> tuple[list[list[int]], dict[int, int], frozenset[int], Zero3Fetch]:
    n = rng.randint(1, 8)
    numel = {k: rng.choice([1, 3, 50, 120, 400]) for k in range(n)}
    cfg = Zero3Fetch(
        prefetch_bucket=rng.choice([0, 10, 100, 1000]),
        max_live=rng.choice([0, 100, 500, 10**6]),
        max_reuse=rng.choice([0, 100, 1000, 10**6]),
        persistence=rng.choice([0, 2, 60]),
    )
    persistent = frozenset(k for k, v in numel.items() if v < cfg.persistence)
    trace = [rng.sample(range(n), rng.randint(1, min(3, n))) for _ in range(rng.randint(1, 25))]
    return trace, numel, persistent, cfg


@pytest.mark.parametrize("seed", range(40))
def test_plan_properties_on_random_traces(seed: int) -> None:
    """Every partitioned weight is gathered when its module runs; a call's prefetch pops less
    than its budget before its last parameter (the bucket, the cap); the elements gathered stay
    within the cap plus the module running and one overshooting parameter; nothing persistent is
    ever gathered; every gathered weight is released by the end."""
    trace, numel, persistent, cfg = _random_case(random.Random(seed))
    plan = plan_fetches(trace, numel, persistent, cfg)
    gathered: set[int] = set()
    biggest = max(numel.values())
    for mod, step in zip(trace, plan, strict=True):
        live_before = sum(numel[k] for k in gathered)
        assert not set(step.fetch) & gathered and not set(step.prefetch) & gathered
        gathered |= set(step.fetch)
        assert {k for k in mod if k not in persistent} <= gathered
        gathered |= set(step.prefetch)
        assert not (set(step.fetch) | set(step.prefetch)) & persistent
        pre = sum(numel[k] for k in step.prefetch)
        assert pre <= cfg.prefetch_bucket + biggest
        mod_numel = sum(numel[k] for k in set(mod))
        assert step.live == sum(numel[k] for k in gathered)
        assert step.live <= max(cfg.max_live, live_before + mod_numel) + biggest
        gathered -= set(step.release)
    assert not gathered


def test_parse_zero3_fetch() -> None:
    assert parse_zero3_fetch("layer") is None
    assert parse_zero3_fetch("deepspeed") == Zero3Fetch()
    got = parse_zero3_fetch("deepspeed:max_live=3e9,prefetch_bucket=5e7,reduce_bucket=90000000")
    assert got == Zero3Fetch(max_live=3_000_000_000, prefetch_bucket=50_000_000, reduce_bucket=90_000_000)
    assert parse_zero3_fetch(str(got)) == got
    for bad in ("fsdp", "deepspeed:live=3", "deepspeed:max_live=1.5", "deepspeed:max_live=-1", "layer:x=1"):
        with pytest.raises(FetchSpecError):
            parse_zero3_fetch(bad)


# -- distribute ---------------------------------------------------------------------------------
TINY = Zero3Fetch(prefetch_bucket=500, max_live=3000, max_reuse=2000, persistence=100, reduce_bucket=900)


@pytest.mark.parametrize(
    ("spec", "strategy", "options"),
    [
        ("gpt:layers=2,hidden=16,heads=2,vocab=32,seq=8,qkv=fused,tied=1", "d2.t1.p1.k2.z3.rfull", {}),
        (
            "gpt:layers=2,hidden=16,heads=2,vocab=32,seq=8,qkv=fused,tied=1",
            "d2.t1.p1.k2.z3.rfull",
            {"comm_streams": True, "one_dp_stream": True},
        ),
        (
            "llama:layers=2,hidden=16,heads=4,kv_heads=2,ffn=24,vocab=32,seq=8",
            "d2.t1.p1.k2.z3",
            {"comm_streams": True},
        ),
        ("gpt:layers=2,hidden=16,heads=2,vocab=32,seq=8", "d2.t2.p1.k1.z3", {"comm_streams": True}),
    ],
)
def test_module_fetch_trains_as_the_sequential_step(
    spec: str, strategy: str, options: dict[str, bool]
) -> None:
    model = build_model(spec, 4, DType.f64)
    cmp = check_against_sequential(model, parse_strategy(strategy), zero3_fetch=TINY, **options)
    err, where = cmp.update_error()
    assert err < 1e-9, (where, err)


def test_module_fetch_trains_as_the_sequential_mixed_step() -> None:
    """Mixed precision: the gathered copies are the bf16 shards', the gradients bf16 until the
    update casts them."""
    assert_mixed_step_matches(
        "gpt:layers=2,hidden=16,heads=2,vocab=32,seq=8,qkv=fused,tied=1",
        "d2.t1.p1.k2.z3.rfull",
        zero3_fetch=TINY,
        comm_streams=True,
        one_dp_stream=True,
    )


GPT = "gpt:layers=3,hidden=64,heads=4,vocab=128,seq=32,qkv=fused,tied=1"
STRATEGY = "d2.t1.p1.k1.1f1b.z3.rfull"


def _program(cfg: Zero3Fetch | None) -> Module:
    s = parse_strategy(STRATEGY)
    model = build_model(GPT, batch=4 * s.d, dtype=DType.f16)
    return distribute(
        model, s, Optimizer("adam"), precision="mixed", comm_streams=True, one_dp_stream=True, zero3_fetch=cfg
    )


def _gather_calls(prog: Module, fn: str) -> int:
    """All-gathers on the gather stream of ``fn`` (of a shard handed over to it), one per call (a
    later part is ``coalesced``)."""
    shards = set(prog[fn].params)
    handed = {op.outputs[0] for op in prog[fn].ops() if op.name == "MeshSend" and op.inputs[0] in shards}
    return sum(
        op.name == "Redistribute" and op.inputs[0] in handed and not op.attrs.get("coalesced")
        for op in prog[fn].ops()
    )


def test_the_programs_gathers_are_the_plans_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """One all-gather per plan call that gathers anything (a fetch, a prefetch), and one at the
    function's start for the persistent weights."""
    import distir.parallel.distribute as D

    plans: list[list[FetchStep]] = []

    def spy(*args: object) -> list[FetchStep]:
        plans.append(plan_fetches(*args))  # type: ignore[arg-type]
        return plans[-1]

    monkeypatch.setattr(D, "plan_fetches", spy)
    prog = _program(TINY)
    fwd = plans[0]  # c0_fwd is built first
    calls = sum(bool(s.fetch) + bool(s.prefetch) for s in fwd)
    assert _gather_calls(prog, "c0_fwd") == calls + 1


def _peak(cfg: Zero3Fetch | None) -> float:
    s = parse_strategy(STRATEGY)
    return simulate(_program(cfg), parse_cluster("dgx-a100"), device_map(s, True)).peak_memory[0]


def test_the_live_cap_and_release_bound_the_gathered_bytes() -> None:
    """Keeping every weight (cap and reuse distance past the model) holds more at the peak than
    fetching one module at a time (no prefetch, no reuse), and at most every gathered weight's
    bytes more; FSDP's whole-layer gathers with their one-layer prefetch hold more than one
    module at a time too."""
    model = build_model(GPT, batch=8, dtype=DType.f16)
    total = sum(w.type.numel for w in model.weights) * 2  # fp16, every weight gathered
    one = _peak(Zero3Fetch(prefetch_bucket=0, max_live=0, max_reuse=0, persistence=100))
    every = _peak(Zero3Fetch(prefetch_bucket=10**9, max_live=10**9, max_reuse=10**9, persistence=100))
    frag = parse_cluster("dgx-a100").device_spec(0).runtime.fragmentation
    assert one < every <= one + total * (1 + frag)
    assert one < _peak(None)


def test_gradient_buckets_follow_deepspeeds_rule() -> None:
    """A gradient that would take a non-empty bucket past reduce_bucket elements closes it: with
    a bucket smaller than every partitioned weight, each of their gradients is reduced in a call
    of its own (the persistent ones join the next weight's call, or end one)."""
    prog = _program(Zero3Fetch(reduce_bucket=1, persistence=100))
    red = [
        op
        for op in prog["c0_bwd_red"].ops()
        if op.name == "Redistribute" and op.outputs[0].name.startswith("g_")
    ]
    calls = [op for op in red if not op.attrs.get("coalesced")]
    assert len(calls) == len(red)  # a bucket of 1 element: every gradient alone


@pytest.mark.parametrize(
    ("strategy", "options"),
    [
        ("d2.t1.p2.k2.1f1b.z3", {}),
        ("d2.t1.p1.k1.1f1b.z3", {"fsdp2_root": True}),
        ("d2.t1.p1.k1.1f1b.z3", {"gather_copy_out": True}),
    ],
)
def test_refused_where_deepspeed_does_not_run_it(strategy: str, options: dict[str, bool]) -> None:
    s = parse_strategy(strategy)
    model = build_model("gpt:layers=2,hidden=16,heads=2,vocab=32,seq=8", 4 * s.k, DType.f32)
    with pytest.raises(StrategyError, match="zero3_fetch"):
        distribute(model, s, Optimizer("adam"), zero3_fetch=Zero3Fetch(), **options)


def test_a_noop_where_nothing_is_gathered_per_use() -> None:
    """ZeRO-1 (and inference) gather nothing per use: the same program as without."""
    s = parse_strategy("d2.t1.p1.k1.1f1b.z1")
    model = build_model("gpt:layers=2,hidden=16,heads=2,vocab=32,seq=8", 4, DType.f32)
    with_ = distribute(model, s, Optimizer("adam"), zero3_fetch=Zero3Fetch())
    without = distribute(model, s, Optimizer("adam"))
    assert str(with_) == str(without)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("deepspeed:max_live=1,max_live=2", "key 'max_live' is given twice"),  # was: the last won
        ("deepspeed:max_live=٢", "is not a number"),  # float() reads Arabic-Indic digits
        ("deepspeed:max_live=1_000", "is not a number"),
        ("deepspeed:max_live= 5", "is not a number"),
        ("deepspeed:foo=1", "unknown key 'foo'; keys: max_live"),
        ("deepspeed:max_live", "'max_live' is not key=value"),
    ],
)
def test_a_knob_is_given_once_in_ascii_digits(text: str, needle: str) -> None:
    with pytest.raises(FetchSpecError, match=needle):
        parse_zero3_fetch(text)
