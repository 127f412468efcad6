"""``distribute(pipelining_kept=...)``: what ``torch.distributed.pipelining``'s stages keep until
the step's end (``distir.parallel.pipeline.stage_state``) — every microbatch's received
activation and gradient, the gradient of each received input, and the stages' outputs (every
stage's, or the last's: the logits), as the step's last results; and the last stage's merge of
the logits, a transient ``Concat``."""

from __future__ import annotations

import pytest

from distir.autodiff.precision import Precision
from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Module
from distir.ir.ops import Call, Op
from distir.ir.types import DType
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.parallel.trainers import trainer_semantics
from distir.sim.simulate import simulate

from .helpers import assert_mixed_step_matches

LLAMA = "llama:layers=4,hidden=64,heads=2,kv_heads=1,ffn=128,seq=16,vocab=256"
FSDP2_PP = {
    "overlap_param_gather": True,
    "fp32_grad_accum": True,
    "reduce_fp32": True,
    "fsdp2_grad_accum": True,
}


def _program(strategy: str, kept: str, train: bool = True, streams: bool = True) -> Module:
    s = parse_strategy(strategy)
    model = build_model(LLAMA, batch=s.k * s.d, dtype=DType.bf16)
    opts = FSDP2_PP if train else {}
    return distribute(
        model,
        s,
        Optimizer("adam"),
        train=train,
        comm_streams=streams,
        precision="mixed",
        pipelining_kept=kept,
        **opts,
    )


def _kept(prog: Module, off: Module) -> list[str]:
    """The names of the results ``prog`` has beyond ``off``'s (the kept values)."""
    n = len(off.entry.outputs)
    assert [v.name for v in prog.entry.outputs[:n]] == [v.name for v in off.entry.outputs]
    return [v.name for v in prog.entry.outputs[n:]]


@pytest.mark.parametrize("strategy", ["d2.t2.sp.p2.k4.1f1b.z2", "d2.t1.p2.k4.interleaved.v2.z2"])
def test_every_keeps_each_microbatchs_transfers_and_outputs(strategy: str) -> None:
    s = parse_strategy(strategy)
    off = _program(strategy, "")
    kept = _kept(_program(strategy, "every"), off)
    chunks, k = s.p * s.v, s.k
    # per microbatch: each chunk's output (the last's: its logits), each chunk but the first's
    # received activation and its input's gradient, each chunk but the last's received gradient
    assert sum(n.startswith("logits_") for n in kept) == k
    assert len(kept) == k * (chunks + 3 * (chunks - 1))


def test_last_keeps_the_last_stages_outputs_only() -> None:
    strategy = "d2.t2.sp.p2.k4.1f1b.z2"
    off = _program(strategy, "")
    every, last = _kept(_program(strategy, "every"), off), _kept(_program(strategy, "last"), off)
    assert len(every) - len(last) == 4  # the first stage's four outputs
    assert sum(n.startswith("logits_") for n in last) == 4


def test_the_merge_concatenates_the_logits_and_nothing_reads_it() -> None:
    prog = _program("d2.t2.sp.p2.k4.1f1b.z2", "last")
    (merge,) = [op for op in prog.entry.ops() if op.name == "Concat"]
    assert [v.name for v in merge.inputs] == [f"logits_{m}" for m in range(4)]
    read = {v for i in prog.entry.body for v in i.inputs} | set(prog.entry.outputs)
    assert merge.outputs[0] not in read
    assert not [op for op in _program("d2.t2.sp.p2.k4.1f1b.z2", "").entry.ops() if op.name == "Concat"]


def test_off_without_pipeline_or_training() -> None:
    for strategy, train in (("d2.t2.sp.p1.k4.1f1b.z2", True), ("d2.t2.sp.p2.k4.1f1b.z2", False)):
        assert len(_program(strategy, "every", train).entry.outputs) == len(
            _program(strategy, "", train).entry.outputs
        )


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(StrategyError, match="pipelining_kept"):
        _program("d2.t2.sp.p2.k4.1f1b.z2", "all")


def test_the_kept_values_raise_the_peak_by_what_they_hold() -> None:
    """The last stage holds its microbatches' logits at the step's end: its peak grows by at
    least those the 1F1B program frees after each microbatch (four fewer in flight than k)."""
    s = parse_strategy("d2.t2.sp.p2.k4.1f1b.z2")
    cl = parse_cluster("dgx-a100")
    peak = {}
    for kept in ("", "every"):
        r = simulate(_program("d2.t2.sp.p2.k4.1f1b.z2", kept), cl, device_map(s, True))
        peak[kept] = max(r.peak_memory[g] for g in r.peak_memory if g >= s.d * s.t)  # stage 1
    logits = 16 * 256 // 2 * 2  # one microbatch on one GPU: a sequence of 16 tokens × 256/2 vocab, bf16
    assert peak["every"] - peak[""] >= 3 * logits


@pytest.mark.parametrize("streams", [True, False])
def test_each_microbatch_receives_into_its_own_buffer_a_donated_step_parameter(streams: bool) -> None:
    strategy = "d2.t1.p2.k4.interleaved.v2.z2"
    prog, off = _program(strategy, "every", streams=streams), _program(strategy, "", streams=streams)
    entry = prog.entry
    bufs = [j for j, p in enumerate(entry.params) if p.name.endswith("_buffer")]
    assert not [p for p in off.entry.params if p.name.endswith("_buffer")]
    assert len(entry.params) - len(off.entry.params) == len(bufs) == 2 * 4 * 3  # 2 kinds × k × 3 boundaries
    into = {d.param: d.result for d in entry.donated}
    n = len(off.entry.outputs)
    # each buffer is written by one transfer, whose result the step keeps (a result after its own)
    assert sorted(into[j] for j in bufs) == sorted(set(into[j] for j in bufs))
    assert all(into[j] >= n for j in bufs)
    made_by = {v: op.name for op in entry.ops() for v in op.outputs}
    assert {made_by[entry.outputs[into[j]]] for j in bufs} == {"MeshSend"}  # by the transfer itself


def test_deepspeeds_engine_is_refused() -> None:
    s = parse_strategy("d1.t1.p2.k4.1f1b.z1")
    model = build_model(LLAMA, batch=4, dtype=DType.bf16)
    with pytest.raises(StrategyError, match="DeepSpeed"):
        distribute(model, s, Optimizer("adam"), deepspeed_pipe=True, pipelining_kept="every")


@pytest.mark.parametrize(("strategy", "kept"), [("d2.t1.p2.k4.1f1b.z2", "last"), ("d2.t1.p1.k4.1f1b.z3", "")])
def test_the_torchtitan_trainer_keeps_the_last_stages_outputs_under_a_pipeline(
    strategy: str, kept: str
) -> None:
    """torchtitan 820504e's torch (June 2025) keeps only the last stage's outputs (pytorch#153383)."""
    sem = trainer_semantics("torchtitan", parse_strategy(strategy), Precision.parse("mixed"), DType.bf16)
    assert sem.switches()["pipelining_kept"] == kept


def _reductions_after_backward(kept: str) -> dict[str, tuple[bool, list[str]]]:
    """Per last backward of a FSDP2 pipeline (``grad_copy_in = "cast"``): whether every gradient
    reduction comes after the last layer's backward call, and the reduced weights in order."""
    s = parse_strategy("d2.t1.p2.k4.1f1b.z2")
    model = build_model(LLAMA, batch=s.k * s.d, dtype=DType.bf16)
    prog = distribute(
        model,
        s,
        Optimizer("adam"),
        comm_streams=True,
        precision="mixed",
        pipelining_kept=kept,
        grad_copy_in="cast",
        bucket_mb=1e-6,  # a bucket per layer: FSDP's groups
        **FSDP2_PP,
    )
    out = {}
    for f in prog.functions:
        if not f.name.endswith("_red"):
            continue
        body = list(f.body)
        calls = [i for i, x in enumerate(body) if isinstance(x, Call) and x.callee.endswith("_bwd")]
        reds = [
            (i, x.outputs[0].name)
            for i, x in enumerate(body)
            if isinstance(x, Op) and x.name == "Redistribute"
        ]
        out[f.name] = (min(i for i, _ in reds) > max(calls), [n for _, n in reds])
    return out


def test_fsdp2_under_pipelining_reduces_after_the_last_backward_in_module_order() -> None:
    """torch.distributed.pipelining runs the backward with gradient sync off, then each FSDP
    group's post_backward in module order (forward order), before the input gradient is sent;
    FSDP's own hooks (no pipelining_kept) reduce each block as its backward completes it."""
    late = _reductions_after_backward("every")
    assert late and all(after for after, _ in late.values())
    names = late["c0_bwd_acc_red"][1]
    assert names[0] == "g_tok_emb"
    blocks = [int(n.rsplit("_", 1)[1]) for n in names[1:]]
    assert blocks == sorted(blocks) and blocks[0] < blocks[-1]
    hooks = _reductions_after_backward("")
    assert not any(after for after, _ in hooks.values())


@pytest.mark.parametrize("strategy", ["d2.t1.p2.k4.1f1b.z2", "d2.t2.sp.p2.k2.interleaved.v2.z2"])
def test_fsdp2_under_pipelining_equals_the_sequential_mixed_step(strategy: str) -> None:
    assert_mixed_step_matches(
        LLAMA,
        strategy,
        comm_streams=True,
        pipelining_kept="every",
        grad_copy_in="cast",
        bucket_mb=1e-6,
        **FSDP2_PP,
    )
