"""Fused attention under data and tensor parallelism: on a dp×tp mesh the zoo transformers'
``Attention`` (and its gradient, and Llama's ``Rope``) run on the batch split over dp and the
heads split over tp — the column-parallel q/k/v projections' (B, S, H) activation sharded on
dim 2, reshaped to (B, S, h, d) sharded on the heads — with no redistribution in front of them;
and the distributed training step equals the sequential one."""

from __future__ import annotations

import pytest

import distir
from distir.frontends.zoo import build_model
from distir.ir.dtensor import DTensorType, Shard
from distir.ir.function import Module
from distir.ir.ops import Op
from distir.ir.types import DType, TensorType
from distir.parallel.check import check_against_sequential
from distir.parallel.strategy import parse_strategy

MODELS = {
    "gpt": "gpt:layers=2,hidden=16,heads=4,seq=4,vocab=16",
    "llama": "llama:layers=2,hidden=16,heads=4,kv_heads=2,ffn=12,vocab=16,seq=4",
}
HEADS = {"Attention": 2, "AttentionGrad": 2, "Rope": 2}  # the heads dim of each op's first input


def _attention_ops(module: Module) -> list[Op]:
    return [i for fn in module.functions for i in fn.body if isinstance(i, Op) and i.name in HEADS]


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["", ".rsel"])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_attention_runs_on_batch_and_head_shards(family: str, recompute: str) -> None:
    s = parse_strategy(f"d2.t2.p1.k1{recompute}")
    model = build_model(MODELS[family], batch=4, dtype=DType.f64)
    cmp = check_against_sequential(model, s)
    # as test_distribute: relative to the largest entry (bk's true gradient is ~0: softmax
    # ignores a constant added to every key)
    assert cmp.max_rel_diff < 1e-7, f"{family}: {cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    ops = _attention_ops(distir.check(cmp.distributed))
    names = {op.name for op in ops}
    assert {"Attention", "AttentionGrad"} <= names and (("Rope" in names) == (family == "llama"))
    for op in ops:
        x = op.inputs[0] if op.name != "AttentionGrad" else op.inputs[1]
        t = x.type
        assert isinstance(t, DTensorType), op
        axes = dict(zip((a for a, _ in t.mesh.axes), t.placements, strict=True))
        assert axes == {"dp": Shard(0), "tp": Shard(HEADS[op.name])}, (op.name, t)
    # the per-device programs run them on (B/2, S, h/2, d) pieces
    for op in _attention_ops(distir.check(cmp.materialized)):
        x = op.inputs[0] if op.name != "AttentionGrad" else op.inputs[1]
        assert isinstance(x.type, TensorType) and x.type.shape[0] == 2 and x.type.shape[2] in (1, 2)
