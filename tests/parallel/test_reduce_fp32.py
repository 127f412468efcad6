"""distribute(..., reduce_fp32=True): FSDP's ``MixedPrecision(reduce_dtype=torch.float32)``
(Composer's DEFAULT mode, torchtitan's default). Under mixed precision each weight gradient is
cast to f32 on the reduction stream before it is reduced, so the reduce-scatter (all-reduce
without ZeRO) moves 4 bytes per element instead of 2, and the optimizer takes the reduced shard
as it is. The step still equals the sequential mixed step (to bf16's roundoff); the reductions'
inputs are f32 pending sums of the weights' whole size (counted by hand from the config)."""

from __future__ import annotations

import math

import pytest

from distir.autodiff.train import Optimizer
from distir.frontends.zoo import build_model
from distir.interp.loop import interpret
from distir.interp.shapes import TypeDomain
from distir.ir.dtensor import DTensorType, Partial
from distir.ir.types import DType
from distir.parallel.distribute import distribute
from distir.parallel.strategy import parse_strategy

from .helpers import assert_mixed_step_matches

LLAMA = "llama:layers=2,hidden=16,heads=2,kv_heads=1,ffn=32,seq=4,vocab=16"


@pytest.mark.parametrize("strategy", ["d2.t1.p1.k2.1f1b.z3", "d2.t1.p1.k1.1f1b.z0", "d2.t2.p1.k2.1f1b.z2"])
@pytest.mark.parametrize("copy_out", [False, True])
def test_step_equals_the_sequential_mixed_step(strategy: str, copy_out: bool) -> None:
    assert_mixed_step_matches(LLAMA, strategy, comm_streams=True, reduce_fp32=True, gather_copy_out=copy_out)


def _reduced(reduce_fp32: bool) -> list[tuple[DType, int]]:
    """(dtype, elements) of every pending sum the backward chunk reduces over dp."""
    s = parse_strategy("d2.t1.p1.k1.1f1b.z3")
    model = build_model(LLAMA, batch=2, dtype=DType.bf16)
    prog = distribute(
        model, s, Optimizer("adam"), precision="mixed", comm_streams=True, reduce_fp32=reduce_fp32
    )
    dom = TypeDomain(record=True)
    interpret(prog, prog.entry, [p.type for p in prog.entry.params], dom)
    bwd = next(f for f in prog.functions if f.name == "c0_bwd_red")
    seen: list[tuple[DType, int]] = []
    for _types, env in dom.envs.get("c0_bwd_red", []):
        for op in bwd.ops():
            t = env.get(op.inputs[0]) if op.name == "Redistribute" else None
            if isinstance(t, DTensorType) and any(isinstance(p, Partial) for p in t.placements):
                seen.append((t.dtype, math.prod(t.shape)))
        break
    return seen


def test_the_gradients_are_reduced_in_f32() -> None:
    h, kv, ffn, v = 16, 8, 32, 16
    per_layer = [h, h * h, h * kv, h * kv, h * h, h, h * ffn, h * ffn, ffn * h]
    want = sorted([v * h, *(per_layer * 2), h, h * v])
    got32, got16 = _reduced(True), _reduced(False)
    assert sorted(n for _, n in got32) == want == sorted(n for _, n in got16)
    assert {d for d, _ in got32} == {DType.f32}
    assert {d for d, _ in got16} == {DType.bf16}
