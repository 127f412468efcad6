"""distribute(..., overlap_param_gather=True): Megatron-LM's --overlap-param-gather. The new
low-precision weights of ZeRO-1/2 are gathered in the next step's first forward instead of after
the optimizer: the training step still equals the sequential mixed step, the compute copy
persists as this rank's shard, each chunk's first forward gathers (one all-gather per weight) and
the others do not, and the gathers run on the dp_gather stream, overlapping the forward."""

from __future__ import annotations

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.dtensor import DTensorType, Shard
from distir.ir.function import Module
from distir.ir.types import DType
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import simulate

from .helpers import assert_mixed_step_matches

GPT = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16"
LLAMA = "llama:layers=4,hidden=8,heads=2,kv_heads=1,ffn=16,seq=4,vocab=16"


@pytest.mark.slow
@pytest.mark.parametrize("spec", [GPT, LLAMA])
@pytest.mark.parametrize(
    "strategy",
    ["d2.t1.p1.k2.1f1b.z1", "d2.t2.sp.p2.k4.1f1b.z2", "d2.t1.p2.k4.interleaved.v2.z1", "d2.t1.p2.k4.zb1.z1"],
)
@pytest.mark.parametrize("streams", [False, True])
def test_step_equals_the_sequential_mixed_step(spec: str, strategy: str, streams: bool) -> None:
    assert_mixed_step_matches(spec, strategy, comm_streams=streams, overlap_param_gather=True)


def _program(strategy: str, og: bool, streams: bool = False) -> Module:
    s = parse_strategy(strategy)
    model = build_model(GPT, batch=s.k * s.d, dtype=DType.bf16)
    return distribute(
        model, s, Optimizer("adam"), precision="mixed", comm_streams=streams, overlap_param_gather=og
    )


def _gathers(fn: object) -> int:
    return sum(1 for op in fn.ops() if op.name == "Redistribute")  # type: ignore[attr-defined]


def test_the_compute_copy_is_a_shard_and_only_the_first_forward_gathers() -> None:
    prog = _program("d2.t1.p1.k4.1f1b.z1", og=True)
    entry = prog.entry
    copies = [p for p in entry.params if p.name.endswith("_bf16")]
    assert copies
    sharded = [
        p for p in copies if isinstance(p.type, DTensorType) and isinstance(p.type.placements[0], Shard)
    ]
    assert sharded, "the persistent compute copies are this rank's shards"
    calls = [c.callee for c in entry.calls()]
    assert calls.count("c0_fwd_gather") == 1 and calls.count("c0_fwd") == 3
    assert _gathers(prog["c0_fwd_gather"]) == len(sharded)  # one all-gather per sharded weight
    assert _gathers(prog["c0_fwd"]) == _gathers(_program("d2.t1.p1.k4.1f1b.z1", og=False)["c0_fwd"])
    # nothing gathers the new copies after the optimizer
    plain = _program("d2.t1.p1.k4.1f1b.z1", og=False).entry
    assert _gathers(entry) == _gathers(plain) - len(sharded)


@pytest.mark.parametrize("strategy", ["d2.t1.p1.k1.1f1b.z3", "d1.t2.p1.k2.1f1b.z1", "d2.t1.p1.k2.1f1b.z0"])
def test_without_zero_1_2_over_data_parallel_replicas_nothing_changes(strategy: str) -> None:
    assert str(_program(strategy, og=True)) == str(_program(strategy, og=False))


def test_the_gathers_overlap_the_first_forward() -> None:
    """With communication streams the first forward's gathers run beside its compute: the step is
    shorter than gathering after the optimizer on the compute stream's critical path would allow
    only if the forward hides them — here it is at least not longer than the plain program plus
    nothing (the gathers move, they are not added)."""
    s = parse_strategy("d2.t1.p1.k2.1f1b.z1")
    cl = parse_cluster("dgx-a100")
    cost = RooflineCostModel(cl)
    model = build_model("gpt:layers=4,hidden=1024,heads=8,seq=512,vocab=1024", batch=4, dtype=DType.bf16)
    s = parse_strategy("d2.t1.p1.k2.1f1b.z2")
    times = {}
    for og in (False, True):
        prog = distribute(
            model, s, Optimizer("adam"), precision="mixed", comm_streams=True, overlap_param_gather=og
        )
        times[og] = simulate(prog, cl, device_map(s, True), cost).step_time_s
    assert times[True] < times[False]


def test_interleaved_chunks_are_gathered_ahead_as_megatrons_schedule_launches_them() -> None:
    """Interleaved with communication streams and Megatron's DDP: every rank's first two chunks
    are gathered before the first forward, each later chunk before its first forward but after
    the step's first forwards (Megatron-LM's ``param_sync_func`` launches), one all-gather per
    sharded weight and none inside a chunk; the step equals the sequential one and is not longer
    than gathering after the optimizer."""
    s = parse_strategy("d2.t1.p2.k4.interleaved.v3.z1")
    spec = "gpt:layers=6,hidden=8,heads=2,seq=4,vocab=16"
    model = build_model(spec, batch=8, dtype=DType.bf16)
    assert_mixed_step_matches(spec, str(s), comm_streams=True, overlap_param_gather=True, megatron_ddp=True)
    prog = distribute(
        model,
        s,
        Optimizer("adam"),
        precision="mixed",
        comm_streams=True,
        overlap_param_gather=True,
        megatron_ddp=True,
    )
    entry = prog.entry
    sharded = {
        p.name.removesuffix("_bf16")
        for p in entry.params
        if p.name.endswith("_bf16")
        and isinstance(p.type, DTensorType)
        and isinstance(p.type.placements[0], Shard)
    }
    body = list(entry.body)
    first_call: dict[str, int] = {}
    gathered_at: dict[str, int] = {}
    for k, op in enumerate(body):
        callee = getattr(op, "callee", None)
        if callee is not None:
            assert not callee.endswith("_gather"), callee
            first_call.setdefault(callee, k)
        elif op.name == "Redistribute" and op.inputs[0].name in sharded:
            assert op.inputs[0].name not in gathered_at, "one gather per weight"
            gathered_at[op.inputs[0].name] = k
    assert set(gathered_at) == sharded
    start = min(first_call.values())
    for c in range(s.p * s.v):
        fwd = f"c{c}_fwd"
        mine = [w for w in (p.name for p in prog[fwd].params[1:]) if w in sharded]
        assert mine
        for w in mine:
            assert gathered_at[w] < first_call[fwd], (c, w)
            assert (gathered_at[w] < start) == (c < 2 * s.p), (c, w)
    big = build_model("gpt:layers=6,hidden=2048,heads=16,seq=1024,vocab=1024", batch=8, dtype=DType.bf16)
    cl = parse_cluster("dgx-a100:2")
    times = {}
    for og in (False, True):
        p = distribute(
            big,
            s,
            Optimizer("adam"),
            precision="mixed",
            comm_streams=True,
            overlap_param_gather=og,
            megatron_ddp=True,
        )
        times[og] = simulate(p, cl, device_map(s, True), RooflineCostModel(cl)).step_time_s
    assert times[True] <= times[False]
