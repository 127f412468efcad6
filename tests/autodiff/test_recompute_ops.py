"""``rops``: torchtitan's op-level selective activation checkpointing — every other matrix product
with a weight and the fused attention saved, everything else recomputed."""

from __future__ import annotations

from distir.autodiff.reverse import POLICIES, SAVE_PRODUCTS
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Function
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


def test_ops_saves_every_other_float8_product_as_a_bf16_one() -> None:
    """Under Float8 torchtitan's policy sees each linear layer's ``torch.mm`` on Float8Tensor
    operands as ``aten.mm`` (torchao eab345c), so it saves the same products as in bf16: every
    other product with a weight (here through its float8 cast), and the fused attention."""
    from distir.autodiff.precision import FP8

    spec = "llama:layers=1,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=64,seq=16"
    bf16 = build_model(spec, 2, DType.bf16).module["block"]
    fp8 = FP8.prepare(build_model(spec, 2, DType.bf16)).module["block"]
    kept = {}
    for name, block in (("bf16", bf16), ("fp8", fp8)):
        products = [op for op in block.body if isinstance(op, Op) and op.name == "MatMul"]
        kept[name] = [SAVE_PRODUCTS(op, block) for op in products]
        saved = {op.name for op in block.body if isinstance(op, Op) and SAVE_PRODUCTS(op, block)}
        assert saved == {"Attention", "MatMul"}
    assert kept["fp8"] == kept["bf16"] == [True, False, True, False, True, False, True]


def _float8_casts(policy: str) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The attributes of the float8 casts of a Llama block's forward and backward under
    ``policy``, in program order."""
    from distir.autodiff.precision import FP8
    from distir.autodiff.reverse import vjp
    from distir.autodiff.train import layer_types

    spec = "llama:layers=1,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=64,seq=16"
    model = FP8.prepare(build_model(spec, 2, DType.bf16))
    call = model.layers[1]
    v = vjp(
        model.module,
        model.module[call.callee],
        layer_types(model)[1],
        range(len(call.inputs)),
        POLICIES[policy],
    )

    def casts(fn: Function) -> list[dict[str, object]]:
        return [dict(op.attrs) for op in fn.ops() if op.name == "Float8Cast"]

    return casts(v.fwd), casts(v.bwd)


def test_ops_casts_again_in_one_pass_and_each_pass_writes_one_layout() -> None:
    """Under torchtitan's op-level checkpointing the backward casts the block's inputs and weights
    again (11 casts: 4 activations, 7 weights) with the amax the forward saved (``_save_list``
    holds ``aten.max``), so in one pass; the forward's casts and those write one layout each; the
    gradient's casts (E5M2, one per product) write both and take their amax."""
    fwd, bwd = _float8_casts("ops")
    assert len(fwd) == 11 and all(a.get("layouts") == 1 and "scaling" not in a for a in fwd)
    again = [a for a in bwd if a["to"] is DType.f8e4m3]
    grads = [a for a in bwd if a["to"] is DType.f8e5m2]
    assert len(again) == 11 and all(
        a == {"to": DType.f8e4m3, "layouts": 1, "scaling": "saved"} for a in again
    )
    assert len(grads) == 7 and all(a == {"to": DType.f8e5m2} for a in grads)


def test_full_checkpointing_casts_again_with_a_fresh_amax_and_saving_all_casts_once() -> None:
    """Full checkpointing saves no amax: the backward's casts take theirs again (two passes),
    one layout each; saving everything, the forward's casts write both layouts and the backward
    casts only the gradients."""
    fwd, bwd = _float8_casts("full")
    assert all(a.get("layouts") == 1 and "scaling" not in a for a in fwd + bwd if a["to"] is DType.f8e4m3)
    fwd, bwd = _float8_casts("none")
    assert len(fwd) == 11 and all(a == {"to": DType.f8e4m3} for a in fwd)
    assert [a["to"] for a in bwd] == [DType.f8e5m2] * 7


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


LLAMA = "llama:layers=3,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=64,seq=16"


def test_ops_eager_keeps_the_unread_last_product_until_the_backward() -> None:
    """Eager PyTorch caches every result its policy saves (``_CachingTorchDispatchMode``): of a
    Llama block's saved products the down projection's is read by no gradient rule (only the
    residual add reads it), so ``ops`` drops it and ``ops-eager`` returns it as one more residual,
    which the backward takes first (a ``StopGradient``, the cache's detached entry) and reads
    nowhere else."""
    from distir.autodiff.train import layer_types, layer_vjps

    model = build_model(LLAMA, 2)
    types = layer_types(model)
    block = next(i for i, c in enumerate(model.layers) if c.callee == "block")
    plain = layer_vjps(model, types, "ops")[0][block].vjp
    eager = layer_vjps(model, types, "ops-eager")[0][block].vjp
    assert eager.n_residuals == plain.n_residuals + 1
    fn = model.module["block"]
    weights = set(fn.params[1:])
    down = [op for op in fn.ops() if op.name == "MatMul" and any(v in weights for v in op.inputs)][-1]
    extra = eager.fwd.outputs[-1]
    assert extra.name == down.outputs[0].name
    first = eager.bwd.body[0]
    assert isinstance(first, Op) and first.name == "StopGradient"
    held = eager.bwd.params[len(eager.bwd_params) + eager.n_residuals - 1]
    assert first.inputs == (held,)
    readers = [op for op in eager.bwd.ops() if held in op.inputs]
    assert readers == [first]
    assert POLICIES["ops-eager"](down, fn) and SAVE_PRODUCTS(down, fn)


def _llama_peak(recompute: str, sac_eager: bool, layers: int) -> float:
    # a vocabulary large enough that the peak is the loss's backward (fp32 logits, their
    # log-softmax and its gradient: 3 × 4,096 × 8,192 × 4 bytes), where every block's residuals live
    spec = f"llama:layers={layers},hidden=256,heads=4,kv_heads=2,ffn=512,vocab=8192,seq=512"
    model = build_model(spec, 8, DType.bf16)
    s = parse_strategy(f"d1.t1.p1.k1.r{recompute}")
    prog = distribute(model, s, comm_streams=True, precision="mixed", sac_eager=sac_eager)
    return simulate(prog, parse_cluster("dgx-a100"), device_map(s, True)).peak_memory[0]


def test_sac_eager_adds_each_blocks_down_projection_at_the_peak() -> None:
    """Hand oracle: the peak (the loss's backward, every block's residuals live) grows by one
    down-projection output per block — batch × seq × hidden bf16 values — plus the allocator's
    reserve on it (5% on dgx-a100); nothing changes under other policies."""
    layers, tokens, hidden = 3, 8 * 512, 256
    extra = layers * tokens * hidden * 2
    frag = parse_cluster("dgx-a100").device_spec(0).runtime.fragmentation
    got = _llama_peak("ops", True, layers) - _llama_peak("ops", False, layers)
    assert abs(got - extra * (1 + frag)) < 1e-6 * extra
    assert _llama_peak("sel", True, layers) == _llama_peak("sel", False, layers)


def test_sac_eager_trains_as_the_sequential_step() -> None:
    model = build_model(LLAMA, 4, DType.f64)
    cmp = check_against_sequential(model, parse_strategy("d2.t2.p1.k2.rops"), sac_eager=True)
    err, where = cmp.update_error()
    assert err < 1e-9, (where, err)
