"""The attention core that selective recomputation recomputes (``reverse.attention_core``) is
found from the registry's ``attention_core`` flag and the structure around it, not from names:
QKᵀ, scale, mask, softmax and ·V of an explicit attention; never an op with a weight input."""

from __future__ import annotations

from distir.autodiff.reverse import SELECTIVE, attention_core
from distir.ir.builder import FunctionBuilder
from distir.ops import REGISTRY


def test_the_core_is_the_chain_around_the_softmax_up_to_the_contractions() -> None:
    fb = FunctionBuilder("layer", REGISTRY.out_arity)
    x, wq, wr = fb.param("x"), fb.param("wq"), fb.param("wr")
    (q,) = fb.op("MatMul", x, wq, names=["q"])  # a weight matmul: saved
    (kt,) = fb.op("Transpose", q, perm=(1, 0), names=["kt"])
    (s,) = fb.op("MatMul", q, kt, names=["scores"])  # QKᵀ
    (sc,) = fb.op("Scale", s, alpha=0.5, names=["scaled"])
    (m,) = fb.op("CausalMask", sc, names=["masked"])
    (p,) = fb.op("Softmax", m, names=["probs"])
    (o,) = fb.op("MatMul", p, q, names=["ctx"])  # ·V
    (r,) = fb.op("Relu", o, names=["act"])
    (logits,) = fb.op("MatMul", r, wr, names=["router_logits"])  # a weight matmul before a softmax
    (g,) = fb.op("Softmax", logits, names=["gates"])
    fn = fb.ret(g)
    core = {o.outputs[0].name for o in attention_core(fn)}
    assert core == {"scores", "scaled", "masked", "probs", "ctx", "gates"}
    saved = {op.outputs[0].name for op in fn.body if SELECTIVE(op, fn)}  # type: ignore[union-attr]
    assert saved == {"q", "kt", "act", "router_logits"}


def test_the_fused_op_is_the_core_by_itself() -> None:
    fb = FunctionBuilder("layer", REGISTRY.out_arity)
    q, k, v = fb.param("q"), fb.param("k"), fb.param("v")
    (qr,) = fb.op("Rope", q, names=["qr"])
    out, _ = fb.op("Attention", qr, k, v, n_out=2, names=["out", "lse"], causal=True)
    (y,) = fb.op("Reshape", out, shape=(0, 0, -1), names=["y"])
    fn = fb.ret(y)
    assert {o.outputs[0].name for o in attention_core(fn)} == {"out"}
