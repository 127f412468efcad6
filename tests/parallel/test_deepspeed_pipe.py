"""distribute(..., deepspeed_pipe=True, fp32_grad_accum=True): DeepSpeed's pipeline engine and
BF16_Optimizer. The step still equals the sequential mixed step; every transfer and the
data-parallel all-reduce run on the compute streams, after the last backward (nothing on a
communication stream); the accumulated gradients are fp32 and the optimizer takes them without
another cast; the fast planner gives the reference planner's figures; ZeRO-2/3 are refused."""

from __future__ import annotations

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Module
from distir.ir.ops import Call
from distir.ir.types import DType
from distir.parallel.distribute import HP_GRAD, device_map, distribute
from distir.parallel.pipeline.deepspeed import train_schedule
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.cost import FixedCostModel, RooflineCostModel
from distir.sim.simulate import SimResult, simulate

from .helpers import assert_mixed_step_matches

GPT = "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16,tied=1"


@pytest.mark.parametrize("strategy", ["d2.t1.p2.k4.1f1b.z1", "d2.t2.p2.k2.1f1b", "d2.t1.p1.k2.z1"])
@pytest.mark.parametrize("fp32", [False, True])
def test_step_equals_the_sequential_mixed_step(strategy: str, fp32: bool) -> None:
    assert_mixed_step_matches(GPT, strategy, comm_streams=True, deepspeed_pipe=True, fp32_grad_accum=fp32)


def _program(strategy: str, ds: bool, fp32: bool, spec: str = GPT) -> Module:
    s = parse_strategy(strategy)
    model = build_model(spec, batch=4 * s.k * s.d, dtype=DType.bf16)
    return distribute(
        model,
        s,
        Optimizer("adam"),
        comm_streams=True,
        precision="mixed",
        deepspeed_pipe=ds,
        fp32_grad_accum=fp32,
    )


def _simulated(strategy: str, ds: bool, fp32: bool, cost: object, planner: str = "fast") -> SimResult:
    s = parse_strategy(strategy)
    cl = parse_cluster("dgx-a100:2")
    return simulate(
        _program(strategy, ds, fp32),
        cl,
        device_map(s, True),
        cost,
        planner=planner,  # type: ignore[arg-type]
    )


def test_nothing_runs_on_a_communication_stream() -> None:
    """Transfers and the gradient all-reduce run on the compute streams: every other stream of
    every GPU stays idle; the plain program reduces on its dp_reduce streams."""
    cost = RooflineCostModel(parse_cluster("dgx-a100:2"))
    ds = _simulated("d2.t1.p2.k4.1f1b.z1", True, True, cost)
    plain = _simulated("d2.t1.p2.k4.1f1b.z1", False, False, cost)
    for r, busy_streams in (
        (ds, set()),
        (plain, {"fwd_send", "fwd_recv", "bwd_send", "bwd_recv", "dp_reduce"}),
    ):
        used = {sl.stream for sl, b, c in zip(r.slots, r.busy_s, r.comm_s, strict=True) if b + c > 0}
        assert used - {"compute"} <= busy_streams
        if not busy_streams:
            assert used == {"compute"}


def test_one_stage_step_is_the_sum_of_its_ops() -> None:
    """With one stage and every collective on the compute stream nothing overlaps: the step takes
    exactly GPU 0's busy plus communication time (each op after the one before); the plain
    program hides part of its all-reduce behind the backward, so its step is shorter than that."""
    cost = FixedCostModel(compute=1.0, comm=0.5)
    r = _simulated("d2.t1.p1.k2.z1", True, False, cost)
    gpu0 = [(b, c) for sl, b, c in zip(r.slots, r.busy_s, r.comm_s, strict=True) if sl.gpu == 0]
    assert r.step_time_s == pytest.approx(sum(b + c for b, c in gpu0))
    plain = _simulated("d2.t1.p1.k2.z1", False, False, cost)
    gpu0 = [(b, c) for sl, b, c in zip(plain.slots, plain.busy_s, plain.comm_s, strict=True) if sl.gpu == 0]
    assert plain.step_time_s < sum(b + c for b, c in gpu0)


def test_each_gradient_is_cast_to_fp32_and_added_into_its_sum() -> None:
    """In every accumulating backward each accumulator takes the sum with the microbatch's
    gradient cast to f32 by a call of ``@hp_grad`` (one Cast: a kernel of its own, as
    ``lp.grad.to(fp32)``); the entry no longer casts the reduced gradients before Adam."""
    prog = _program("d2.t1.p2.k4.1f1b.z1", True, True)
    (cast,) = prog[HP_GRAD].ops()
    assert cast.name == "Cast" and cast.attrs["to"] is DType.f32
    for name in ("c0_bwd_acc", "c1_bwd_acc"):
        fn = prog[name]
        accs = {p for p in fn.params if p.name.startswith("acc_")}
        made = {o: x for x in fn.body for o in x.outputs}
        adds = [op for op in fn.ops() if op.name == "Add" and op.inputs[0] in accs]
        assert len(adds) == len(accs) > 0, name
        for op in adds:
            src = made[op.inputs[1]]
            assert isinstance(src, Call) and src.callee == HP_GRAD, name
    casts = {
        ds: sum(op.name == "Cast" for op in _program("d2.t1.p2.k4.1f1b.z1", True, ds).entry.ops())
        for ds in (False, True)
    }
    assert casts[True] < casts[False]


@pytest.mark.parametrize("fp32", [False, True])
def test_fast_planner_gives_the_reference_figures(fp32: bool) -> None:
    cost = RooflineCostModel(parse_cluster("dgx-a100:2"))
    fast = _simulated("d2.t2.p2.k4.1f1b.z1", True, fp32, cost)
    ref = _simulated("d2.t2.p2.k4.1f1b.z1", True, fp32, cost, planner="reference")
    assert fast.step_time_s == ref.step_time_s
    assert fast.peak_memory == ref.peak_memory
    assert fast.busy_s == ref.busy_s and fast.comm_s == ref.comm_s


def test_fp32_accumulators_hold_two_more_bytes_per_parameter() -> None:
    """The accumulated gradients of a one-stage, one-replica step at its end: 4 bytes per
    parameter instead of 2 (the peak is reached with them alive, after the last backward)."""
    spec = "gpt:layers=2,hidden=256,heads=4,seq=64,vocab=512"
    s = parse_strategy("d1.t1.p1.k2")
    cl = parse_cluster("dgx-a100")
    model = build_model(spec, batch=4, dtype=DType.bf16)
    n_params = sum(w.type.numel for w in model.weights)
    peaks = {}
    for fp32 in (False, True):
        prog = distribute(model, s, Optimizer("adam"), precision="mixed", fp32_grad_accum=fp32)
        peaks[fp32] = simulate(prog, cl, device_map(s), RooflineCostModel(cl)).peak_memory[0]
    assert peaks[True] - peaks[False] >= 2 * n_params


@pytest.mark.parametrize("strategy", ["d2.t1.p2.k2.1f1b.z2", "d2.t1.p1.k2.z3"])
def test_zero_2_and_3_are_refused(strategy: str) -> None:
    with pytest.raises(StrategyError, match="ZeRO 0 or 1 only"):
        _program(strategy, True, False)


def test_fp32_accumulation_needs_mixed_precision() -> None:
    s = parse_strategy("d1.t1.p1.k2")
    model = build_model(GPT, batch=2, dtype=DType.bf16)
    with pytest.raises(StrategyError, match="mixed precision"):
        distribute(model, s, Optimizer("adam"), precision="pure", fp32_grad_accum=True)


UNTIED = "gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256"


def _one_replica(strategy: str, ds: bool) -> SimResult:
    """One replica (d = 1) of an untied model: no data-parallel or tied-embedding reduction, so
    with and without ``deepspeed_pipe`` the passes and the transfers are the only difference."""
    s = parse_strategy(strategy)
    cl = parse_cluster("dgx-a100")
    model = build_model(UNTIED, batch=2 * s.k, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam"), comm_streams=True, precision="mixed", deepspeed_pipe=ds)
    return simulate(prog, cl, device_map(s, True), RooflineCostModel(cl), trace=True)


@pytest.mark.parametrize("strategy", ["d1.t1.p2.k4.1f1b", "d1.t1.p4.k8.1f1b", "d1.t1.p4.k3.1f1b"])
def test_blocking_is_never_faster_than_overlapped(strategy: str) -> None:
    """Every stage runs the same passes in the same order either way (DeepSpeed's TrainSchedule
    is 1F1B: tests/parallel/pipeline/test_deepspeed.py), at the same cost; DeepSpeed's transfers
    add waits (each is a rendezvous of both compute streams) and time on the compute streams, and
    take nothing away, so its step cannot be shorter."""
    assert _one_replica(strategy, True).step_time_s >= _one_replica(strategy, False).step_time_s


def _passes(r: SimResult, gpu: int) -> tuple[list[float], list[float]]:
    """(start, duration) of each chunk call on ``gpu``'s compute stream in time order, a call's
    duration taking in the ops after it up to the next call or transfer (the last stage's loss
    gradient seed); the transfers' slices are left out."""
    slot = next(i for i, sl in enumerate(r.slots) if sl.gpu == gpu and sl.stream == "compute")
    mine = sorted((a, b, name) for name, a, b, sl, _c in r.slices or [] if sl == slot)
    starts: list[float] = []
    ends: list[float] = []
    open_call = False  # the ops since the last call belong to it (no transfer between)
    for a, b, name in mine:
        if name.startswith("@c"):
            starts.append(a)
            ends.append(b)
            open_call = True
        elif "Send" in name:
            open_call = False
        elif open_call:
            ends[-1] = b
    return starts, [e - s for s, e in zip(starts, ends, strict=True)]


def _transfer_time(r: SimResult) -> float:
    (t,) = {round(b - a, 15) for name, a, b, _sl, _c in r.slices or [] if "Send" in name}
    return t


@pytest.mark.parametrize("strategy", ["d1.t1.p2.k3.1f1b", "d1.t1.p4.k8.1f1b", "d1.t1.p3.k5.1f1b"])
def test_step_replays_train_schedule_with_rendezvous(strategy: str) -> None:
    """An independent replay of DeepSpeed's engine: each stage runs its TrainSchedule
    instructions in order; a pass takes its simulated time; a send and its receive start together
    when both stages reach them (blocking ``dist.send``/``dist.recv``) and hold both for the
    transfer's time. Every pass starts when the replay says."""
    s = parse_strategy(strategy)
    r = _one_replica(strategy, True)
    c = _transfer_time(r)
    got = [_passes(r, st) for st in range(s.p)]
    instrs = train_schedule(s.p, s.k)
    clock, pos, n_pass = [0.0] * s.p, [0] * s.p, [0] * s.p
    want: list[list[float]] = [[] for _ in range(s.p)]
    peer = {"SendActivation": 1, "RecvGrad": 1, "SendGrad": -1, "RecvActivation": -1}
    match = {"SendActivation": "RecvActivation", "RecvActivation": "SendActivation"}
    match |= {"SendGrad": "RecvGrad", "RecvGrad": "SendGrad"}
    while any(pos[st] < len(instrs[st]) for st in range(s.p)):
        moved = False
        for st in range(s.p):
            while pos[st] < len(instrs[st]):
                ins = instrs[st][pos[st]]
                if ins.kind in ("F", "B"):
                    want[st].append(clock[st])
                    clock[st] += got[st][1][n_pass[st]]
                    n_pass[st] += 1
                    pos[st] += 1
                    moved = True
                    continue
                o = st + peer[ins.kind]
                other = instrs[o][pos[o]] if pos[o] < len(instrs[o]) else None
                if other is None or (other.kind, other.microbatch) != (match[ins.kind], ins.microbatch):
                    break  # the peer has not reached the matching call yet
                clock[st] = clock[o] = max(clock[st], clock[o]) + c
                pos[st] += 1
                pos[o] += 1
                moved = True
        assert moved, "the replay deadlocked"
    for st in range(s.p):
        assert got[st][0] == pytest.approx(want[st], rel=1e-9, abs=1e-15), st


@pytest.mark.parametrize("strategy", ["d1.t1.p2.k4.gpipe", "d1.t1.p2.k4.zb1", "d1.t1.p2.k4.v2.interleaved"])
def test_other_schedules_are_refused(strategy: str) -> None:
    with pytest.raises(StrategyError, match="TrainSchedule"):
        _program(strategy, True, False)


def test_transfers_are_partitioned_over_tensor_parallel_ranks() -> None:
    """With t = 2 each tensor-parallel rank sends its half of the activation (and of its
    gradient): every transfer between stages carries mb·seq·hidden·2 bytes / t; the receiver
    all-gathers it whole (one gather per forward on stage 1, one per backward on stage 0), and
    stage 0 gathers its sent output whole again before each backward (``PartitionedTensor.full``
    in DeepSpeed's ``_exec_forward_pass`` / ``_exec_backward_pass``)."""
    s = parse_strategy("d1.t2.p2.k2.1f1b")
    cl = parse_cluster("dgx-a100")
    mb, seq, hidden = 2, 32, 64
    model = build_model(UNTIED, batch=mb * s.k, dtype=DType.bf16)
    prog = distribute(model, s, Optimizer("adam"), comm_streams=True, precision="mixed", deepspeed_pipe=True)
    r = simulate(prog, cl, device_map(s, True), RooflineCostModel(cl), trace=True, trace_detail="op")
    top = [sl for sl in r.trace_detail().slices if sl.depth == 0]
    sends = [sl for sl in top if sl.name == "MeshSend" and r.slots[sl.slot].gpu in (0, 2)]
    assert len(sends) == 2 * 2 * s.k  # both stages (tp rank 0 of each) see each of 2k transfers
    assert {sl.args["message_bytes"] for sl in sends} == {mb * seq * hidden * 2 / s.t}
    gathers = {0: 0, 2: 0}  # GPU 0 runs stage 0, GPU 2 stage 1 (tp ranks 0)
    for sl in top:
        gpu = r.slots[sl.slot].gpu
        if (
            gpu in gathers
            and "S(2)]]" in sl.args.get("inputs", [""])[0]
            and "R]]" in sl.args.get("outputs", [""])[0]
        ):
            gathers[gpu] += 1
    assert gathers == {0: 2 * s.k, 2: s.k}
