"""A coalesced collective (a gradient bucket, a layer's parameter gather) runs as ONE collective
call in ``distir run`` (``distir.backend.worker.coalesced_calls``, ``OpDef.torch_coalesced``),
as the simulator prices it (its latency once) and as the trainers issue it; its results equal
the reference executor's, one part at a time."""

from __future__ import annotations

from typing import Any

import pytest

import distir
from distir.backend.program import file_program, model_program, rank_programs
from distir.backend.worker import agreed_calls, coalesced_calls
from distir.ir import Device, DType, FunctionBuilder, Module, TensorType
from distir.ir.rewrite import inline_calls
from distir.ops import REGISTRY
from distir.ops.registry import OpKind


def _parts() -> Module:
    """Parts of coalesced collectives on 2 devices: an all-reduce bucket of different shapes
    mixed with a reduce-scatter (one call each kind), uneven gathers and scatters along dims 0
    and 1, a part computed after its call's first (runs on its own), reductions that cannot
    share a buffer, and a group out of rank order."""
    d0, d1 = Device(0), Device(1)
    fb = FunctionBuilder("parts", REGISTRY.out_arity)
    a = fb.param("a", TensorType(DType.f32, (5, 3), d0))
    c = fb.param("c", TensorType(DType.f32, (5, 3), d1))
    b = fb.param("b", TensorType(DType.f32, (4, 3), d1))
    v = fb.param("v", TensorType(DType.f32, (7,), d0))
    w = fb.param("w", TensorType(DType.f32, (7,), d1))
    outs: list[Any] = []
    outs += fb.op("AllReduce", a, c)  # call 1: all-reduce parts and reduce-scatter parts
    outs += fb.op("ReduceScatter", a, c, dim=0, coalesced=True)  # 5 rows: 3 and 2
    outs += fb.op("AllReduce", v, w, coalesced=True)
    outs += fb.op("ReduceScatter", a, c, dim=1, coalesced=True)  # 3 columns: 2 and 1
    outs += fb.op("AllReduce", v, w, op="mean", coalesced=True)
    (na,) = fb.op("Neg", a)
    outs += fb.op("AllReduce", na, c, coalesced=True)  # computed after the first: on its own
    outs += fb.op("AllGather", a, b, dim=0)  # call 2: uneven pieces, 5 and 4 rows
    outs += fb.op("AllGather", a, c, dim=1, coalesced=True)
    outs += fb.op("AllGather", v, w, dim=0, coalesced=True)
    outs += fb.op("AllReduce", a, c, op="max")  # call 3: sum and max cannot share a buffer
    outs += fb.op("AllReduce", a, c, coalesced=True)
    outs += fb.op("AllGather", b, a, dim=0)  # call 4: group (d1, d0), out of rank order
    outs += fb.op("AllGather", w, v, dim=0, coalesced=True)
    outs += fb.op("ReduceScatter", c, a, dim=0, coalesced=True)
    outs = [fb.op("Neg", o)[0] for o in outs]
    return distir.check(Module((fb.ret(*outs),)))


def _rank_ops(module: Module, device: int = 0) -> tuple[list[Any], list[Any]]:
    """Rank ``device``'s ops and parameters."""
    fn = inline_calls(rank_programs(file_program(module, "parts"))[device].program)
    return list(fn.body), list(fn.params)


def test_the_parts_of_one_collective_share_its_call_when_their_inputs_are_ready() -> None:
    ops, params = _rank_ops(_parts())
    calls = coalesced_calls(ops, params)
    names = {k: [ops[j].name.removeprefix("rank.") for j in parts] for k, parts in calls.items()}
    assert sorted(names.values()) == sorted(
        [
            ["AllReduce", "AllReduce", "AllReduce"],  # the Neg-fed part is not among them
            ["ReduceScatter", "ReduceScatter"],
            ["AllGather", "AllGather", "AllGather"],
            ["AllReduce", "AllReduce"],  # max and sum: the call runs them one by one
            ["AllGather", "AllGather"],
        ]
    )
    assert all(parts == sorted(parts) for parts in calls.values())  # issued at the first part


def test_ranks_agree_on_every_call_where_their_readiness_differs() -> None:
    """The Neg-fed part is computed after its call's first part on d0 only (on d1 its input is
    a parameter): alone, d1 would put it in the call and d0 not, a collective mismatch. Agreed,
    both ranks make the same calls, part for part."""
    ranks = rank_programs(file_program(_parts(), "parts"))
    fns = [inline_calls(r.program) for r in ranks]
    local = [coalesced_calls(list(fn.body), list(fn.params)) for fn in fns]
    assert sorted(map(len, local[0].values())) != sorted(map(len, local[1].values()))
    agreed = agreed_calls(fns)
    assert agreed == [r.calls for r in ranks]

    def keys(fn: Any, calls: tuple[tuple[int, ...], ...]) -> list[list[tuple[Any, str]]]:
        ops = list(fn.body)
        return sorted([[(ops[j].attrs["group"], ops[j].name) for j in c] for c in calls])

    assert keys(fns[0], agreed[0]) == keys(fns[1], agreed[1])
    assert sorted(map(len, agreed[0])) == [2, 2, 2, 3, 3]


@pytest.mark.parametrize("strategy", ["d2.t1.p1.k1.1f1b", "d2.t1.p1.k2.1f1b.z2", "d2.t1.p1.k2.1f1b.z3"])
def test_a_data_parallel_step_issues_the_collective_calls_the_simulator_prices(strategy: str) -> None:
    """Every unflagged collective is a call the simulator charges a latency for; the real run
    issues one call per collective kind of a bucket (a bucket may mix a reduce-scatter and an
    all-reduce), so at most one more per bucket."""
    prog = model_program("gpt:layers=2,hidden=16,heads=2,seq=8,vocab=32", strategy, 4)
    fn = inline_calls(rank_programs(prog)[0].program)
    ops = list(fn.body)
    comm = [op for op in ops if REGISTRY[op.name].kind is OpKind.RANK_COMM]
    priced = sum(1 for op in comm if not op.attrs.get("coalesced"))
    calls = coalesced_calls(ops, fn.params)
    issued = len(comm) - sum(len(p) - 1 for p in calls.values())
    buckets = sum(1 for k in calls if not ops[k].attrs.get("coalesced"))
    assert any(op.attrs.get("coalesced") for op in comm)
    assert priced <= issued <= priced + buckets


@pytest.mark.slow
def test_coalesced_parts_run_as_one_call_and_equal_the_reference() -> None:
    pytest.importorskip("torch")
    from distir.backend.launch import LaunchOptions, launch
    from distir.backend.verify import compare, reference_outputs

    prog = file_program(_parts(), "parts", seed=3)
    jobs = rank_programs(prog, 1, trace=True)
    results = [g[0] for g in launch([[j] for j in jobs], LaunchOptions(timeout_s=120))]
    want = reference_outputs(prog.module, prog.args)
    v = compare(prog.module, want, {r.device: r.outputs for r in results})
    assert v.verified, v
    ops, params = _rank_ops(prog.module)
    comm = sum(1 for op in ops if REGISTRY[op.name].kind is OpKind.RANK_COMM)
    shared = sum(len(p) - 1 for p in coalesced_calls(ops, params).values())
    slices = [s for s in results[0].slices if s.category == "comm"]
    assert len(slices) == comm - shared  # one traced call per collective call issued
