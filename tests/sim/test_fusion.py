"""Fused elementwise chains (distir.sim.fusion) and how the roofline cost model prices them."""

from __future__ import annotations

import pytest

import distir
from distir.hardware.cluster import parse_cluster
from distir.interp.shapes import infer_types
from distir.ir import Module, parse_module, print_module
from distir.ir.types import DType, TensorType
from distir.ops import REGISTRY
from distir.ops.registry import Fusion
from distir.parallel.sharding.materialize import materialize
from distir.sim.cost import RooflineCostModel
from distir.sim.fusion import FusedInput, fused_inputs
from distir.sim.simulate import simulate

A100 = parse_cluster("dgx-a100")

X, W, B = "Tensor[f16, (2048, 1024), d0]", "Tensor[f16, (1024, 4096), d0]", "Tensor[f16, (4096,), d0]"
W2 = "Tensor[f16, (4096, 1024), d0]"
# bias+GeLU after the first product, bias+residual after the second: Megatron's fused kernels
MLP = f"""func @mlp(%x: {X}, %w1: {W}, %b1: {B}, %w2: {W2}, %b2: Tensor[f16, (1024,), d0]) {{
  %h = MatMul(%x, %w1)
  %hb = Add(%h, %b1)
  %g = Gelu(%hb)
  %y = MatMul(%g, %w2)
  %yb = Add(%y, %b2)
  %r = Add(%x, %yb)
  return %r
}}
"""


def _names(m: Module) -> list[tuple[str, FusedInput | None]]:
    fn = m.entry
    return [(op.name, link) for op, link in zip(fn.body, fused_inputs(fn), strict=True)]  # type: ignore[union-attr]


def test_registry_declares_how_ops_fuse() -> None:
    assert REGISTRY["MatMul"].fusion is Fusion.GEMM and REGISTRY["Gemm"].fusion is Fusion.GEMM
    for name in ("Add", "Mul", "Gelu", "Relu", "Scale", "CausalMask", "Cast", "GeluGrad"):
        assert REGISTRY[name].fusion is Fusion.POINTWISE, name
    for name in ("Softmax", "LayerNormalization", "RMSNormalization", "SoftmaxGrad"):
        assert REGISTRY[name].fusion is Fusion.ROWWISE, name
    assert REGISTRY["Transpose"].fusion is Fusion.NONE and REGISTRY["Adam"].fusion is Fusion.NONE


def test_chains_of_the_mlp() -> None:
    """Add joins the MatMul (epilogue), Gelu the Add; the second chain likewise, and the residual
    Add joins the bias Add through its second input. Single-use links are ``sole``."""
    got = _names(parse_module(MLP))
    assert got == [
        ("MatMul", None),
        ("Add", FusedInput(0, True)),
        ("Gelu", FusedInput(0, True)),
        ("MatMul", None),
        ("Add", FusedInput(0, True)),
        ("Add", FusedInput(1, True)),
    ]


def test_a_shared_result_is_linked_but_not_sole_and_rowwise_ends_a_chain() -> None:
    t = "Tensor[f32, (8, 16), d0]"
    text = f"""func @f(%x: {t}) {{
  %a = Scale(%x, alpha=0.5)
  %b = CausalMask(%a)
  %p = Softmax(%b, axis=1)
  %q = Relu(%p)
  %s = Add(%b, %q)
  return %s
}}
"""
    got = _names(parse_module(text))
    # %a's first use links (the producer is pointwise); %b is used twice: not sole; Relu does not
    # join the Softmax (a row-wise op ends a chain); the last Add is not %b's first consumer
    assert got == [
        ("Scale", None),
        ("CausalMask", FusedInput(0, True)),
        ("Softmax", FusedInput(0, False)),
        ("Relu", None),
        ("Add", FusedInput(1, True)),
    ]


def test_a_returned_result_is_not_sole() -> None:
    t = "Tensor[f32, (8, 16), d0]"
    text = f"func @f(%x: {t}) {{\n  %a = Relu(%x)\n  %b = Neg(%a)\n  return %a, %b\n}}\n"
    assert _names(parse_module(text)) == [("Relu", None), ("Neg", FusedInput(0, False))]


def test_fused_time_by_hand() -> None:
    """A fused Gelu after the bias Add (16 MiB in, 16 MiB out, f16): it launches nothing and
    moves nothing when its input has no other use, its output only otherwise."""
    cm = RooflineCostModel(A100)
    t = TensorType(DType.f16, (2048, 4096), distir.ir.Device(0))
    gelu = REGISTRY["Gelu"]
    spec = A100.device_spec(0)
    n = t.nbytes
    unfused = cm.compute_time(gelu, [t], [t], {}, 0)
    bw = spec.memory_bandwidth * cm.memory_efficiency
    flops_t = 8.0 * 2048 * 4096 / (spec.bf16 * cm.flop_efficiency["elementwise"])
    assert unfused == pytest.approx(spec.launch_overhead_s + max(flops_t, 2 * n / bw))
    assert cm.fused_time(gelu, [t], [t], {}, 0, FusedInput(0, False)) == pytest.approx(max(flops_t, n / bw))
    assert cm.fused_time(gelu, [t], [t], {}, 0, FusedInput(0, True)) == pytest.approx(flops_t)


def test_fused_chains_cost_less_and_keep_values_memory_and_flops() -> None:
    m = distir.check(parse_module(MLP))
    before = print_module(m)
    fused = simulate(m, A100)
    unfused = simulate(m, A100, cost_model=RooflineCostModel(A100, fuse=False))
    assert fused.step_time_s < unfused.step_time_s
    # a cost annotation, not a rewrite: the program (so every value it computes), its FLOPs and
    # its memory are the same
    assert print_module(m) == before
    assert fused.flops == unfused.flops and fused.peak_memory == unfused.peak_memory
    # the saving is the chains' launches and round trips: 4 elementwise ops join a kernel
    spec = A100.device_spec(0)
    assert unfused.step_time_s - fused.step_time_s > 4 * spec.launch_overhead_s


def test_fusion_off_is_every_op_its_own_kernel() -> None:
    m = distir.check(parse_module(MLP))
    cm = RooflineCostModel(A100, fuse=False)
    r = simulate(m, A100, cost_model=cm)
    by_hand = 0.0
    types = infer_types(m)[1]
    for op in m.entry.ops():
        d = REGISTRY[op.name]
        ins = [types[v] for v in op.inputs]
        outs = [types[v] for v in op.outputs]
        by_hand += cm.compute_time(d, ins, outs, op.attrs, 0)
    assert r.step_time_s == pytest.approx(by_hand, rel=1e-12)


def test_bias_dropout_residual_add_is_one_kernel_and_the_mask_is_written() -> None:
    """Megatron's fused bias+dropout+add: Dropout (two results) joins the bias Add, and the
    residual Add joins Dropout through Y; the mask, used by no op of the kernel, is still
    written."""
    y, o = "Tensor[f16, (2048, 1024), d0]", "Tensor[f16, (1024,), d0]"
    text = f"""func @f(%x: {y}, %w: Tensor[f16, (1024, 1024), d0], %b: {o}) {{
  %h = MatMul(%x, %w)
  %hb = Add(%h, %b)
  %d, %mask = Dropout(%hb, p=0.1)
  %r = Add(%x, %d)
  return %r, %mask
}}
"""
    m = distir.check(parse_module(text))
    assert _names(m) == [
        ("MatMul", None),
        ("Add", FusedInput(0, True)),
        ("Dropout", FusedInput(0, True)),
        ("Add", FusedInput(1, True)),
    ]
    fused = simulate(m, A100)
    unfused = simulate(m, A100, cost_model=RooflineCostModel(A100, fuse=False))
    assert unfused.step_time_s - fused.step_time_s > 3 * A100.device_spec(0).launch_overhead_s
    # fused into the chain, Dropout moves only its 1-byte mask: its input comes from registers, and
    # its write of Y takes the place of the bias Add's saved write (fused_time's convention)
    cm, spec = RooflineCostModel(A100), A100.device_spec(0)
    t = TensorType(DType.f16, (2048, 1024), distir.ir.Device(0))
    mask = TensorType(DType.bool, t.shape, t.device)
    drop = REGISTRY["Dropout"]
    attrs = distir.ir.values.Attrs({"p": 0.1})
    got = cm.fused_time(drop, [t], [t, mask], attrs, 0, FusedInput(0, True))
    assert got == pytest.approx(mask.nbytes / (spec.memory_bandwidth * cm.memory_efficiency))


def test_the_softmax_after_the_scores_product_is_a_kernel_of_its_own() -> None:
    """The naive attention's QKᵀ, scale, mask, softmax: the scale and the mask are the product's
    epilogue, but the softmax (a row reduction) cannot be: it reads the masked scores from memory
    and writes the probabilities, as Megatron-LM's fused scale-mask-softmax after ``baddbmm``. Its
    time is the unfused roofline by hand: launch + (scores in + probabilities out) / bandwidth."""
    q, kt = "Tensor[f16, (8, 512, 64), d0]", "Tensor[f16, (8, 64, 512), d0]"
    text = f"""func @f(%q: {q}, %k: {kt}) {{
  %s = MatMul(%q, %k)
  %a = Scale(%s, alpha=0.125)
  %b = CausalMask(%a)
  %p = Softmax(%b, axis=2)
  return %p
}}
"""
    m = distir.check(parse_module(text))
    assert _names(m) == [
        ("MatMul", None),
        ("Scale", FusedInput(0, True)),
        ("CausalMask", FusedInput(0, True)),
        ("Softmax", None),
    ]
    cm = RooflineCostModel(A100)
    spec = A100.device_spec(0)
    scores = TensorType(DType.f16, (8, 512, 512), distir.ir.Device(0))
    softmax = REGISTRY["Softmax"]
    flops = softmax.flops([scores], [scores], {"axis": 2})
    bw = spec.memory_bandwidth * cm.memory_efficiency
    by_hand = spec.launch_overhead_s + max(
        flops / (spec.fp16 * cm.flop_efficiency[softmax.cost_class]), 2 * scores.nbytes / bw
    )
    assert cm.compute_time(softmax, [scores], [scores], {"axis": 2}, 0) == pytest.approx(by_hand)
    # after a pointwise op that no GEMM heads, a row-wise op still joins (a norm after an add)
    t = "Tensor[f32, (8, 16), d0]"
    plain = f"func @g(%x: {t}) {{\n  %a = Relu(%x)\n  %p = Softmax(%a, axis=1)\n  return %p\n}}\n"
    assert _names(parse_module(plain)) == [("Relu", None), ("Softmax", FusedInput(0, True))]


TP = "mesh(x=2; d0, d1)"
# a row-parallel product's partial sums all-reduced (Redistribute to R), a bias added, a softmax
ROW_PARALLEL = f"""func @f(%x: DTensor[f32, (2, 1), {TP}, [S(0)]], %w: DTensor[f32, (1, 2), {TP}, [S(1)]],
        %b: DTensor[f32, (1,), {TP}, [R]]) {{
  %y = MatMul(%w, %x)
  %r = Redistribute(%y, to="R")
  %a = Add(%b, %r)
  %s = Softmax(%a, axis=-1)
  return %s
}}
"""


def test_a_rowwise_op_after_a_collective_joins_the_chain_the_collective_started() -> None:
    """The Add passes the Redistribute to the product's chain only if the Redistribute moved
    nothing; the Softmax after it then cannot join (a GEMM's chain takes pointwise epilogues
    only), but where the Redistribute moved data (an all-reduce here) the Add starts a chain the
    Softmax joins: its link is conditional on that (``unless``), so the SPMD program costs as its
    materialized form, whose AllReduce ends the product's chain."""
    m = distir.check(parse_module(ROW_PARALLEL))
    assert _names(m) == [
        ("MatMul", None),
        ("Redistribute", None),
        ("Add", FusedInput(1, True, via=1)),
        ("Softmax", FusedInput(0, True, unless=(1,))),
    ]
    link = FusedInput(0, True, unless=(1,))
    assert link.resolved(lambda i: True) is None  # an all-view path: the product's chain
    assert link.resolved(lambda i: False) == FusedInput(0, True)
    assert FusedInput(1, True, via=1).resolved(lambda i: False) is None
    flat = distir.check(materialize(m))
    for planner in ("fast", "reference"):
        spmd_t = simulate(m, A100, planner=planner).step_time_s
        assert spmd_t == pytest.approx(simulate(flat, A100, planner=planner).step_time_s, rel=1e-12)


# a residual add and the RMSNorm after a product, and SwiGLU's product after two: what
# torch.compile's Inductor fuses around the cuBLAS calls of torchtitan's Llama block
ROWS, HID, FFN = 2048, 1024, 4096
_ACT, _W = f"Tensor[bf16, ({ROWS}, {HID}), d0]", f"Tensor[bf16, ({HID}, {FFN}), d0]"
_WO, _G = f"Tensor[bf16, ({HID}, {HID}), d0]", f"Tensor[bf16, ({HID},), d0]"
BLOCK = f"""func @f(%x: {_ACT}, %h: {_ACT}, %wo: {_WO}, %g: {_G}, %w1: {_W}, %w3: {_W}) {{
  %o = MatMul(%h, %wo)
  %r = Add(%x, %o)
  %n = RMSNormalization(%r, %g)
  %a = MatMul(%n, %w1)
  %b = MatMul(%n, %w3)
  %s = Silu(%a)
  %y = Mul(%s, %b)
  return %r, %y
}}
"""


def test_without_gemm_epilogues_chains_start_after_the_product() -> None:
    """``epilogues=False`` (Inductor's default mode: products are extern cuBLAS kernels): the
    residual Add heads its own kernel, reading the product, and the RMSNorm joins it (one
    add+norm kernel, the sum still written for the next residual); Silu heads SwiGLU's kernel
    and the Mul joins it. With epilogues the Add joins the product and the norm, after a chain
    a GEMM heads, is a kernel of its own."""
    fn = parse_module(BLOCK).entry
    assert fn is not None
    names = [op.name for op in fn.body]
    assert list(zip(names, fused_inputs(fn, epilogues=False), strict=True)) == [
        ("MatMul", None),
        ("Add", None),
        ("RMSNormalization", FusedInput(0, False)),
        ("MatMul", None),
        ("MatMul", None),
        ("Silu", None),
        ("Mul", FusedInput(0, True)),
    ]
    assert list(zip(names, fused_inputs(fn), strict=True)) == [
        ("MatMul", None),
        ("Add", FusedInput(1, True)),
        ("RMSNormalization", None),
        ("MatMul", None),
        ("MatMul", None),
        ("Silu", FusedInput(0, True)),
        ("Mul", FusedInput(0, True)),
    ]


def test_inductor_kernels_cost_each_product_as_its_own_kernel() -> None:
    """``of_kernels("inductor")`` (fused chains, no GEMM epilogue) costs the block op by op as
    the links above say: every product, the Add and Silu a kernel of their own, the RMSNorm and
    the Mul inside them; between the fused and the eager figures, FLOPs and memory unchanged."""
    m = distir.check(parse_module(BLOCK))
    inductor = RooflineCostModel.of_kernels(A100, "inductor")
    types = infer_types(m)[1]
    by_hand = 0.0
    for op, link in zip(m.entry.body, fused_inputs(m.entry, epilogues=False), strict=True):  # type: ignore[union-attr]
        d, ins, outs = REGISTRY[op.name], [types[v] for v in op.inputs], [types[v] for v in op.outputs]
        if link is None:
            by_hand += inductor.compute_time(d, ins, outs, op.attrs, 0)
        else:
            by_hand += inductor.fused_time(d, ins, outs, op.attrs, 0, link)
    got = simulate(m, A100, cost_model=inductor)
    assert got.step_time_s == pytest.approx(by_hand, rel=1e-12)
    fused = simulate(m, A100, cost_model=RooflineCostModel.of_kernels(A100, "fused"))
    eager = simulate(m, A100, cost_model=RooflineCostModel.of_kernels(A100, "eager"))
    assert fused.step_time_s < got.step_time_s < eager.step_time_s
    assert got.flops == fused.flops and got.peak_memory == fused.peak_memory
    with pytest.raises(ValueError, match="kernels must be one of"):
        RooflineCostModel.of_kernels(A100, "max-autotune")


def test_inductor_runs_a_normalizations_backward_as_two_kernels() -> None:
    """Under ``inductor`` kernels an RMSNorm's and a LayerNorm's backward are two kernels
    (pytorch/pytorch#165370: dX over the hidden axis, dScale over the rows, not fusible): one
    launch more and dY and X read again; the other kernels and the forward are unchanged."""
    t = TensorType(DType.bf16, (8192, 4096), distir.ir.Device(0))
    g = TensorType(DType.bf16, (4096,), distir.ir.Device(0))
    fused = RooflineCostModel.of_kernels(A100, "fused")
    inductor = RooflineCostModel.of_kernels(A100, "inductor")
    spec = A100.device_spec(0)
    bw = spec.memory_bandwidth * fused.memory_efficiency
    for name, ins, outs in (
        ("RMSNormalizationGrad", [t, t, g], [t, g]),
        ("LayerNormalizationGrad", [t, t, g], [t, g, g]),
    ):
        d = REGISTRY[name]
        assert d.inductor_split is not None and d.inductor_split.reread == (0, 1)
        one = fused.compute_time(d, ins, outs, {}, 0)
        two = inductor.compute_time(d, ins, outs, {}, 0)
        assert two - one == pytest.approx(spec.launch_overhead_s + 2 * t.nbytes / bw, rel=1e-9)
        link = FusedInput(0, True)
        extra = inductor.fused_time(d, ins, outs, {}, 0, link) - fused.fused_time(d, ins, outs, {}, 0, link)
        assert extra == pytest.approx(spec.launch_overhead_s + 2 * t.nbytes / bw, rel=1e-9)
    norm = REGISTRY["RMSNormalization"]
    assert norm.inductor_split is None
    assert inductor.compute_time(norm, [t, g], [t], {}, 0) == fused.compute_time(norm, [t, g], [t], {}, 0)
