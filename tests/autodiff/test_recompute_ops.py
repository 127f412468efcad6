"""``rops``: torchtitan's op-level selective activation checkpointing — every other matrix product
with a weight and the fused attention saved, everything else recomputed."""

from __future__ import annotations

from distir.autodiff.reverse import POLICIES, SAVE_PRODUCTS
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.ops import Op
from distir.ir.types import DType
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import simulate

GPT = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=64"


def test_ops_saves_products_and_fused_attention_only() -> None:
    model = build_model(GPT, 2)
    block = model.module["block"]
    saved = {op.name for op in block.body if isinstance(op, Op) and SAVE_PRODUCTS(op, block)}
    assert saved == {"MatMul", "Attention"}
    assert POLICIES["ops"] is SAVE_PRODUCTS
    assert str(parse_strategy("d1.t1.p1.k1.rops")) == "d1.t1.p1.k1.1f1b.rops"


def test_ops_saves_every_other_weight_product_in_program_order() -> None:
    """torchtitan counts ``aten.mm`` per block and recomputes the even ones: of a Llama block's
    seven products (q, k, v, o, gate, up, down) the 1st, 3rd, 5th and 7th are kept."""
    model = build_model("llama:layers=1,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=64,seq=16", 2)
    block = model.module["block"]
    weights = set(block.params[1:])
    products = [op for op in block.ops() if op.name == "MatMul" and any(v in weights for v in op.inputs)]
    assert len(products) == 7
    kept = [SAVE_PRODUCTS(op, block) for op in products]
    assert kept == [True, False, True, False, True, False, True]


def test_ops_memory_lies_between_selective_and_full() -> None:
    """Saving only products keeps less than Megatron's selective (which keeps norms and the MLP's
    activations) and more than full recomputation (the layer's input only)."""
    peaks = {}
    for r in ("sel", "ops", "full"):
        model = build_model("gpt:layers=4,hidden=256,heads=4,seq=512,vocab=256", 8, DType.bf16)
        s = parse_strategy(f"d1.t1.p1.k1.r{r}")
        prog = distribute(model, s, comm_streams=True, precision="mixed")
        peaks[r] = simulate(prog, parse_cluster("dgx-a100"), device_map(s, True)).peak_memory[0]
    assert peaks["sel"] > peaks["ops"] > peaks["full"]


def test_ops_trains_as_the_sequential_step() -> None:
    model = build_model(GPT, 4, DType.f64)
    cmp = check_against_sequential(model, parse_strategy("d2.t2.p1.k2.rops"))
    err, where = cmp.update_error()
    assert err < 1e-9, (where, err)
