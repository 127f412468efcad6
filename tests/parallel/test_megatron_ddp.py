"""distribute(..., megatron_ddp=True): Megatron-LM's DistributedDataParallel with
``--overlap-grad-reduce`` and its distributed optimizer (megatron/core/distributed at f2e5db4):
the gradients accumulate whole and are reduced in the last microbatch's backward; a bucket holds
max(40M, 1M·dp) parameters; only the first model chunk of the first pipeline stage is bucketed
(every other chunk's gradients are one bucket, after its last backward); with ZeRO-1 each bucket
is reduce-scattered to the rank's shard instead of all-reduced and sliced; before its reduction
each gradient passes the bucket's NaN-check norm and its scaling (``Bucket.start_grad_sync``).

Oracles: the sequential mixed step (the values), and the program's reductions counted against
the model's weights (how many, to which placement, how many calls)."""

from __future__ import annotations

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.ir.dtensor import Shard, parse_placements
from distir.ir.function import Function, Module
from distir.ir.ops import Call
from distir.ir.types import DType
from distir.parallel import distribute as dist
from distir.parallel.distribute import distribute
from distir.parallel.strategy import parse_strategy

from .helpers import assert_mixed_step_matches

GPT = "gpt:layers=4,hidden=32,heads=2,seq=8,vocab=64"


@pytest.mark.parametrize(
    "strategy",
    ["d2.t1.p1.k2.1f1b.z1", "d2.t1.p2.k4.1f1b.z1", "d2.t2.sp.p2.k2.1f1b.z1", "d2.t1.p2.k4.interleaved.v2.z1"],
)
def test_step_equals_the_sequential_mixed_step(strategy: str) -> None:
    assert_mixed_step_matches(GPT, strategy, comm_streams=True, megatron_ddp=True, reduce_fp32=True)


def _program(strategy: str, megatron: bool) -> Module:
    s = parse_strategy(strategy)
    model = build_model(GPT, batch=2 * s.d * s.k, dtype=DType.bf16)
    return distribute(
        model, s, Optimizer("adam"), comm_streams=True, precision="mixed", megatron_ddp=megatron
    )


def _grad_reductions(fn: Function) -> list[tuple[bool, bool]]:
    """(reduced to a dp shard, coalesced) of every gradient reduction over dp in ``fn``."""
    out = []
    for op in fn.ops():
        if op.name != "Redistribute" or not op.outputs[0].name.startswith("g_"):
            continue
        to = parse_placements(str(op.attrs["to"]))
        out.append((isinstance(to[0], Shard), bool(op.attrs.get("coalesced"))))
    return out


def test_zero1_reduce_scatters_to_the_shard() -> None:
    """Every weight whose shape splits over dp is reduce-scattered to its shard in the last
    backward (Megatron's ``_reduce_scatter_base``); without the option ZeRO-1 all-reduces."""
    for megatron in (False, True):
        prog = _program("d2.t1.p1.k2.1f1b.z1", megatron)
        red = next(f for f in prog.functions if f.name == "c0_bwd_acc_red")
        got = _grad_reductions(red)
        sharded = sum(s for s, _ in got)
        assert got and (sharded > len(got) // 2 if megatron else sharded == 0)
        # no slicing after the reduction: the optimizer takes the shard as reduced
        entry_slices = [
            op for op in prog.entry.ops() if op.name == "Redistribute" and op.outputs[0].name.startswith("g_")
        ]
        assert not entry_slices if megatron else entry_slices


def test_later_chunks_reduce_in_one_call_and_the_first_by_parameter_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a bucket of one block's parameters, the first stage's last backward reduces in
    several calls and the second stage's in exactly one (Megatron: ``bucket_size = None`` on
    pipeline ranks > 0)."""
    h = 32
    block = 12 * h * h + 13 * h  # a GPT block: QKV, out, two MLP weights, biases, two norms
    monkeypatch.setattr(dist, "MEGATRON_BUCKET", block)
    monkeypatch.setattr(dist, "MEGATRON_BUCKET_PER_RANK", 1)
    prog = _program("d2.t1.p2.k4.1f1b.z1", True)
    calls = {}
    for f in prog.functions:
        if f.name.endswith(("_red", "_grad_sync")):
            got = _grad_reductions(f)
            calls[f.name[:2]] = sum(not c for _, c in got)
    assert calls["c1"] == 1
    assert calls["c0"] >= 2  # two blocks (and the embedding) on stage 0, a bucket per block


def test_the_default_bucket_is_megatrons_parameter_count() -> None:
    """max(40M, 1M·dp) parameters: 40M up to dp = 40, then 1M per rank."""
    assert max(dist.MEGATRON_BUCKET, dist.MEGATRON_BUCKET_PER_RANK * 48) == 48_000_000
    assert max(dist.MEGATRON_BUCKET, dist.MEGATRON_BUCKET_PER_RANK * 8) == 40_000_000


def test_replicated_weights_stay_all_reduced() -> None:
    """ZeRO-0 (no distributed optimizer): Megatron's DDP all-reduces every bucket."""
    prog = _program("d2.t1.p1.k2.1f1b.z0", True)
    red = next(f for f in prog.functions if f.name == "c0_bwd_acc_red")
    got = _grad_reductions(red)
    assert got and not any(s for s, _ in got)


def _entry_order(strategy: str) -> list[str]:
    """The entry's instructions in program order: a call as its callee, an op as its first
    output's name."""
    prog = _program(strategy, True)
    return [i.callee if isinstance(i, Call) else i.outputs[0].name for i in prog.entry.body]


def test_later_stages_reduce_after_sending_their_last_input_gradient() -> None:
    """1F1B: stage 1's gradients are reduced by a call of their own after its last backward has
    sent its input gradient (Megatron's ``grad_sync_func`` after the cooldown loop's
    ``send_backward``); stage 0's first model chunk still reduces inside its last backward."""
    order = _entry_order("d2.t1.p2.k4.1f1b.z1")
    last_bwd = max(i for i, n in enumerate(order) if n.startswith("c1_bwd"))
    sent = min(i for i, n in enumerate(order) if i > last_bwd and n.startswith("dy0_3"))
    sync = order.index("c1_grad_sync")
    assert last_bwd < sent < sync
    assert not order[last_bwd].endswith("_red") and order[last_bwd] == "c1_bwd_acc"
    assert "c0_bwd_acc_red" in order and "c0_grad_sync" not in order


def test_interleaved_chunks_reduce_rank_backward_steps_later() -> None:
    """Interleaved: a chunk of pipeline rank r is reduced after r more backward steps of its
    rank (``grad_sync_microbatch_id = microbatch_id - pipeline_parallel_rank``), or after its
    rank's last backward when fewer are left; rank 0's later chunk right after its last."""
    order = _entry_order("d2.t1.p2.k4.interleaved.v2.z1")
    for c, rank in ((3, 1), (1, 1), (2, 0)):
        last = max(i for i, n in enumerate(order) if n.startswith(f"c{c}_bwd"))
        sync = order.index(f"c{c}_grad_sync")
        between = [
            n
            for n in order[last + 1 : sync]
            if n.startswith(("c1_bwd", "c3_bwd") if rank else ("c0_bwd", "c2_bwd"))
        ]
        mine = [
            i
            for i, n in enumerate(order)
            if n.startswith(("c1_bwd", "c3_bwd") if rank else ("c0_bwd", "c2_bwd"))
        ]
        left = sum(1 for i in mine if i > last)
        assert len(between) == min(rank, left), (c, between)


def test_each_reduced_gradient_is_normed_then_scaled_on_the_compute_stream() -> None:
    """``Bucket.start_grad_sync`` (param_and_grad_buffer.py at f2e5db4): the NaN check's norm of
    the bucket's gradients, then their scaling by 1/dp, then the reduction — per gradient here: a
    ``ReduceSum`` of every element (its result for the host only), a ``Scale`` by 1 (distir's loss
    is normalized by the global batch already), both before the hand-over to the reduction stream.
    Without the option no gradient is scaled."""
    for megatron in (False, True):
        red = next(
            f for f in _program("d2.t1.p1.k2.1f1b.z1", megatron).functions if f.name == "c0_bwd_acc_red"
        )
        ops = list(red.ops())
        where = {o.outputs[0].name: i for i, o in enumerate(ops)}
        scaled = [o for o in ops if o.name == "Scale" and o.outputs[0].name.endswith("_scaled")]
        norms = [o for o in ops if o.name == "ReduceSum" and o.outputs[0].name.endswith("_nan_norm")]
        if not megatron:
            assert not scaled and not norms
            continue
        reduced = [o for o in ops if o.name == "Redistribute" and o.outputs[0].name.startswith("g_")]
        assert len(scaled) == len(norms) == len(reduced) > 0
        for sc, nm in zip(scaled, norms, strict=True):
            assert sc.attrs["alpha"] == 1.0 and nm.inputs[0] is sc.inputs[0]
            assert where[nm.outputs[0].name] < where[sc.outputs[0].name]
            # the scaled gradient is what goes to the reduction stream
            send = next(o for o in ops if sc.outputs[0] in o.inputs)
            assert send.name == "MeshSend"
