"""ZeRO-3 as PyTorch FSDP runs it: distribute(..., one_dp_stream, grad_copy_in, gather_cast,
fsdp1_root).

``one_dp_stream``: FSDP's all-gathers and reduce-scatters go over one process group, so one
NCCL stream per GPU runs them one after another in issue order (``ProcessGroupNCCL``'s
``ncclStreams_``, one per device); a layer's reduce-scatter is issued after the next layer's
gather (FSDP's pre-backward prefetch comes before the post-backward reduction), and the compute
stream waits for a gather only, never for the reduction queued behind it.

``grad_copy_in``: each gradient is copied into the flat reduce-scatter buffer on the compute
stream before it is reduced: ``copy`` (FSDP1: autograd's backward of the flat parameter's split
views writes the flat gradient), ``cast`` (FSDP2: ``chunk_cat`` into the reduce dtype, which
with ``reduce_fp32`` is the cast itself, moved off the reduction stream).

``gather_cast``: no bf16 shard held through the step; each gather casts the fp32 shard first.
``fsdp1_root``: FSDP1 keeps the root unit (embedding, final norm, head) gathered from its forward
to the backward, but not the last block (``fsdp2_root`` keeps that too).

Oracles: the sequential mixed step (the reference executor), closed-form copy costs, and the
collective calls counted in the program."""

from __future__ import annotations

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Module
from distir.ir.types import DType
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.cost import FixedCostModel, RooflineCostModel
from distir.sim.simulate import simulate

from .helpers import assert_mixed_step_matches

LLAMA = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,seq=16,vocab=64"
SMALL = "llama:layers=2,hidden=16,heads=2,kv_heads=1,ffn=32,seq=4,vocab=16"
STRATEGY = "d2.t1.p1.k1.1f1b.z3"
TINY_BUCKET = 1e-6  # MiB: every layer's gradients are a bucket of their own


@pytest.mark.parametrize("strategy", ["d2.t1.p1.k2.1f1b.z3", "d2.t2.p1.k2.1f1b.z3", "d2.t1.p1.k2.1f1b.z2"])
@pytest.mark.parametrize("copy_in", ["copy", "cast"])
def test_step_equals_the_sequential_mixed_step(strategy: str, copy_in: str) -> None:
    assert_mixed_step_matches(
        SMALL, strategy, comm_streams=True, reduce_fp32=True, one_dp_stream=True, grad_copy_in=copy_in
    )


def _program(streams: bool = True, **options: bool | str) -> Module:
    s = parse_strategy(STRATEGY)
    model = build_model(LLAMA, batch=2 * s.d, dtype=DType.bf16)
    return distribute(
        model,
        s,
        Optimizer("adam"),
        precision="mixed",
        comm_streams=streams,
        bucket_mb=TINY_BUCKET,
        **options,  # type: ignore[arg-type]
    )


def _ops(prog: Module, name: str, fn_name: str) -> list[object]:
    fn = next(f for f in prog.functions if f.name == fn_name)
    return [op for op in fn.ops() if op.name == name]


def _calls(prog: Module) -> int:
    """Collective calls a step issues (a ``coalesced`` Redistribute is a later part of a call)."""
    called = [c.callee for c in prog.entry.calls()]
    fns = {f.name: f for f in prog.functions}
    entry = [op for op in prog.entry.ops() if op.name == "Redistribute"]
    inner = [op for name in called for op in fns[name].ops() if op.name == "Redistribute"]
    return sum(not op.attrs.get("coalesced", False) for op in entry + inner)


def test_the_reductions_run_on_the_gather_stream() -> None:
    """The backward hands values to the compute, gather and reduction streams' meshes on two
    streams; on one, the reduction stream is never used."""
    n = parse_strategy(STRATEGY).devices
    compute = "dp=2, tp=1; d0, d1"
    dp_reduce = f"dp=2, tp=1; d{5 * n}, d{5 * n + 1}"  # STREAMS: dp_reduce fifth, dp_gather sixth
    dp_gather = f"dp=2, tp=1; d{6 * n}, d{6 * n + 1}"

    def meshes(prog: Module) -> set[str]:
        return {str(op.attrs["mesh"]) for op in _ops(prog, "MeshSend", "c0_bwd_red")}  # type: ignore[attr-defined]

    assert meshes(_program()) == {compute, dp_reduce, dp_gather}
    assert meshes(_program(one_dp_stream=True)) == {compute, dp_gather}


def test_one_stream_serializes_every_collective_and_leaves_it_no_gap() -> None:
    """With compute free and every collective call costing 1 s, one stream runs the step's
    collective calls back to back: the step takes as many seconds as it issues calls; on two
    streams a reduction overlaps the next gather, so the step is shorter."""
    cluster = parse_cluster("dgx-a100")
    cost = FixedCostModel(compute=0.0, comm=1.0, free_local=True)
    dm = device_map(parse_strategy(STRATEGY), True)
    one = _program(one_dp_stream=True)
    two = _program()
    t_one = simulate(one, cluster, dm, cost, batch=4).step_time_s
    t_two = simulate(two, cluster, dm, cost, batch=4).step_time_s
    assert _calls(one) == _calls(two)
    assert t_one == pytest.approx(_calls(one))
    assert t_two < t_one


def test_the_compute_never_waits_for_a_reduction() -> None:
    """Collectives far shorter than a layer's compute hide behind it on one stream as on two:
    the compute waits for a gather only, not for the reduction queued after it."""
    cluster = parse_cluster("dgx-a100")
    cost = FixedCostModel(compute=1.0, comm=1e-3, free_local=True)
    dm = device_map(parse_strategy(STRATEGY), True)
    t_one = simulate(_program(one_dp_stream=True), cluster, dm, cost, batch=4).step_time_s
    t_two = simulate(_program(), cluster, dm, cost, batch=4).step_time_s
    assert t_one == pytest.approx(t_two, abs=1e-9)


def _block_weight_elements() -> int:
    h, kv, ffn = 64, 2 * (64 // 4), 128
    return 2 * h + h * h + 2 * h * kv + h * h + 3 * h * ffn


WEIGHTS = 2 * 9 + 3  # two blocks of nine, the token embedding, the final norm, the head
ELEMENTS = 2 * _block_weight_elements() + 64 * 64 + 64 + 64 * 64


@pytest.mark.parametrize("reduce_fp32", [False, True])
def test_the_copy_in_costs_a_read_and_a_write_of_every_gradient(reduce_fp32: bool) -> None:
    """Without streams (one chain), ``copy`` adds one copy of every bf16 gradient: 2 + 2 bytes
    per element over the bandwidth, a launch each; ``cast`` under ``reduce_fp32`` is the cast the
    reduction did anyway (moved to the compute stream: the same step), and without it a copy."""
    cluster = parse_cluster("dgx-a100")
    cost = RooflineCostModel(cluster, fuse=False)
    dm = device_map(parse_strategy(STRATEGY), False)

    def step(copy_in: str) -> float:
        prog = _program(False, reduce_fp32=reduce_fp32, grad_copy_in=copy_in)
        return simulate(prog, cluster, dm, cost, batch=4).step_time_s

    spec = cluster.device_spec(0)
    mem = spec.memory_bandwidth * 0.8
    want = 4 * ELEMENTS / mem + WEIGHTS * spec.launch_overhead_s
    base = step("")
    assert step("copy") - base == pytest.approx(want, rel=1e-6)
    if reduce_fp32:
        assert step("cast") == pytest.approx(base, rel=1e-9)
    else:
        assert step("cast") - base == pytest.approx(want, rel=1e-6)


def test_cast_copy_in_moves_the_cast_to_the_compute_stream() -> None:
    """``reduce_fp32`` alone casts what was handed to the reduction stream (the Cast reads a
    MeshSend); with ``grad_copy_in="cast"`` the compute stream casts and hands the fp32 copy over
    (a MeshSend reads the Cast)."""
    plain = _program(reduce_fp32=True)
    moved = _program(reduce_fp32=True, grad_copy_in="cast")

    def cast_after_send(prog: Module) -> tuple[int, int]:
        fn = next(f for f in prog.functions if f.name == "c0_bwd_red")
        made_by = {id(v): op.name for op in fn.ops() for v in op.outputs}
        casts = [op for op in fn.ops() if op.name == "Cast"]
        sends = [op for op in fn.ops() if op.name == "MeshSend"]
        after = sum(made_by.get(id(op.inputs[0])) == "MeshSend" for op in casts)
        before = sum(made_by.get(id(op.inputs[0])) == "Cast" for op in sends)
        return after, before

    assert cast_after_send(plain) == (WEIGHTS, 0)
    assert cast_after_send(moved) == (0, WEIGHTS)


def test_an_unknown_copy_in_is_refused() -> None:
    with pytest.raises(StrategyError, match="grad_copy_in"):
        _program(grad_copy_in="chunk_cat")


@pytest.mark.parametrize(
    "strategy",
    ["d2.t1.p1.k2.1f1b.z3", "d2.t2.p1.k1.1f1b.z3.rops", "d2.t1.p2.k4.zb1.z3", "d4.t1.p1.k2.1f1b.z3h2"],
)
def test_gather_cast_step_equals_the_sequential_mixed_step(strategy: str) -> None:
    assert_mixed_step_matches(
        SMALL,
        strategy,
        comm_streams=True,
        reduce_fp32=True,
        one_dp_stream=True,
        grad_copy_in="cast",
        gather_cast=True,
        gather_copy_out=True,
    )


def test_gather_cast_holds_no_bf16_shard_through_the_step() -> None:
    """FSDP casts each fp32 shard as it gathers it and keeps no bf16 copy: the tensors' peak
    falls by exactly this rank's bf16 shard of every weight (2 bytes per element over d)."""
    cluster = parse_cluster("dgx-a100")
    cost = RooflineCostModel(cluster, fuse=False)
    dm = device_map(parse_strategy(STRATEGY), True)

    def peak(gather_cast: bool) -> float:
        res = simulate(_program(gather_cast=gather_cast), cluster, dm, cost, batch=4)
        return max(res.peak_memory[g] - res.runtime_memory.get(g, 0.0) for g in res.peak_memory)

    d = parse_strategy(STRATEGY).d
    assert peak(False) - peak(True) == pytest.approx(2 * ELEMENTS / d, abs=0.5)


ROOT_LLAMA = "llama:layers=3,hidden=256,heads=4,kv_heads=2,ffn=512,seq=512,vocab=8192"


def _root_program(**options: bool) -> Module:
    s = parse_strategy(STRATEGY)
    model = build_model(ROOT_LLAMA, batch=4 * s.d, dtype=DType.bf16)
    return distribute(model, s, Optimizer("adam"), precision="mixed", comm_streams=True, **options)


def _gathers(prog: Module, fn_name: str) -> int:
    return len(_ops(prog, "Redistribute", fn_name))


def test_fsdp1_root_keeps_the_root_gathered_but_not_the_last_block() -> None:
    """The backward gathers the root's three weights (embedding, final norm, head) no more, the
    last block's nine still (``fsdp2_root``: neither); at the loss's backward the GPU holds the
    whole bf16 embedding besides (vocab × hidden × 2 bytes, with the allocator's reserve on it)."""
    plain, one, two = _root_program(), _root_program(fsdp1_root=True), _root_program(fsdp2_root=True)
    assert _gathers(plain, "c0_fwd") == _gathers(one, "c0_fwd") == _gathers(two, "c0_fwd")
    assert _gathers(plain, "c0_bwd_red") - _gathers(one, "c0_bwd_red") == 3
    assert _gathers(plain, "c0_bwd_red") - _gathers(two, "c0_bwd_red") == 3 + 9
    cluster = parse_cluster("dgx-a100")
    dm = device_map(parse_strategy(STRATEGY), True)
    frag = cluster.device_spec(0).runtime.fragmentation
    extra = 8192 * 256 * 2 * (1 + frag)
    got = simulate(one, cluster, dm).peak_memory[0] - simulate(plain, cluster, dm).peak_memory[0]
    assert got == pytest.approx(extra, rel=1e-6)


def test_fsdp1_root_trains_as_the_sequential_step() -> None:
    assert_mixed_step_matches(
        SMALL, "d2.t1.p1.k2.1f1b.z3", comm_streams=True, fsdp1_root=True, gather_cast=True
    )


@pytest.mark.parametrize("strategy", ["d2.t1.p1.k2.1f1b.z3.rops", "d2.t2.sp.p1.k1.1f1b.z3"])
def test_the_reference_planner_agrees_with_the_fsdp_options(strategy: str) -> None:
    """The fast planner's figures equal the reference planner's with every FSDP option on
    (microbatches; tensor and sequence parallelism)."""
    cl = parse_cluster("dgx-a100")
    s = parse_strategy(strategy)
    model = build_model("llama:layers=3,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=256,seq=32", 8, DType.bf16)
    for root in ("fsdp1_root", "fsdp2_root"):
        prog = distribute(
            model,
            s,
            Optimizer("adam"),
            precision="mixed",
            comm_streams=True,
            reduce_fp32=True,
            one_dp_stream=True,
            grad_copy_in="copy" if root == "fsdp1_root" else "cast",
            gather_cast=True,
            gather_copy_out=root == "fsdp2_root",
            **{root: True},  # type: ignore[arg-type]
        )
        fast = simulate(prog, cl, device_map(s, True))
        ref = simulate(prog, cl, device_map(s, True), planner="reference")
        assert fast.step_time_s == ref.step_time_s
        assert fast.peak_memory == ref.peak_memory


@pytest.mark.parametrize("root", ["fsdp1_root", "fsdp2_root"])
def test_the_root_units_gradients_are_reduced_together_last(root: str) -> None:
    """FSDP reduces a unit's gradients in its post-backward hook, once all are complete: the
    root's (final norm, head, token embedding) in one call after every block's, though the head's
    is complete first; without the option, the head's gradient is reduced as soon as it is."""

    def reduced(prog: Module) -> list[tuple[str, bool]]:
        return [
            (str(op.outputs[0].name), bool(op.attrs.get("coalesced", False)))
            for op in _ops(prog, "Redistribute", "c0_bwd_red")
        ]  # type: ignore[attr-defined]

    got = reduced(_root_program(**{root: True}))
    assert {n for n, _ in got[-3:]} == {"g_norm", "g_wlm", "g_tok_emb"}
    assert [c for _, c in got[-3:]] == [False, True, True]
    plain = [n for n, _ in reduced(_root_program())]
    assert plain.index("g_wlm") < plain.index("g_wq_0")
