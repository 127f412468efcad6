"""Linear algebra: MatMul (numpy/ONNX batched semantics) and Gemm (Y = alpha·A'·B' + beta·C)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distir.hardware.gemm import GemmShape
from distir.ir.ops import Op
from distir.ir.types import DType, TensorType, Type
from distir.ir.values import Attrs, Value
from distir.ops import sharding as sharding_rules
from distir.ops._rules import broadcast_shapes, float_attr, int_attr, numel, same_dtype
from distir.ops.gradrules import GradCtx, first, reshape, unbroadcast
from distir.ops.registry import AttrSpec, CostClass, Fusion, OpDef, TypeCtx, register

if TYPE_CHECKING:
    from distir.backend.context import TorchContext

FAMILY = "linalg"
COST_CLASS = CostClass.LINALG  # how the family's ops are costed


def _matmul_shape(ctx: TypeCtx, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a or not b:
        ctx.fail("MatMul inputs must have rank >= 1", 0 if not a else 1, "rank >= 1", 0)
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        ctx.fail(f"MatMul contraction mismatch: {a} @ {b}", 1, a2[-1], b2[-2])
    batch = broadcast_shapes(ctx, [a2[:-2], b2[:-2]])
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def swap_last(shape: Sequence[int], trans: bool | int) -> tuple[int, ...]:
    """``shape`` with its last two dims swapped when ``trans``: how MatMul's ``transA``/``transB``
    read an operand."""
    s = tuple(shape)
    return (*s[:-2], s[-1], s[-2]) if trans else s


def _trans(attrs: Attrs) -> tuple[int, int]:
    return int_attr(attrs, "transA", 0), int_attr(attrs, "transB", 0)


FLOAT8_PRODUCT = DType.bf16
"""The dtype of a product of two float8 operands (``torch._scaled_mm``'s ``out_dtype`` as
torchao's Float8Linear calls it in bf16 training)."""

# how a float8 cast finds its scale: from this tensor's amax (torchao's dynamic scaling, the
# default) or from earlier steps' amax history (Transformer Engine's delayed scaling)
DYNAMIC_SCALING = "dynamic"
FLOAT8_SCALINGS = (DYNAMIC_SCALING, "delayed")


def _matmul_rule(ctx: TypeCtx) -> Sequence[Type]:
    a, b = ctx.tensor(0), ctx.tensor(1)
    if a.dtype.is_float8 or b.dtype.is_float8:
        if not (a.dtype.is_float8 and b.dtype.is_float8):
            i = 1 if a.dtype.is_float8 else 0
            got = ctx.tensor(i).dtype
            ctx.fail("MatMul of a float8 operand needs both operands float8", i, "float8", got)
    else:
        same_dtype(ctx, [0, 1])
    ta, tb = ctx.attr("transA"), ctx.attr("transB")
    for i, (t, flag, name) in enumerate(((a, ta, "transA"), (b, tb, "transB"))):
        if flag and t.rank < 2:
            ctx.fail(f"MatMul {name} needs an operand of rank >= 2", i, "rank >= 2", t.rank)
    dtype = FLOAT8_PRODUCT if a.dtype.is_float8 else a.dtype
    return (ctx.out(dtype, _matmul_shape(ctx, swap_last(a.shape, ta), swap_last(b.shape, tb))),)


def _matmul_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    ta, tb = _trans(attrs)
    a, b = np.asarray(args[0]), np.asarray(args[1])
    return (np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b),)


def _matmul_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    a = ins[0]
    k = swap_last(a.shape, _trans(attrs)[0])[-1] if isinstance(a, TensorType) and a.shape else 1
    return 2.0 * numel(outs[0]) * k


def _matmul_gemm(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> GemmShape:
    """As torch runs it: a product by a matrix (rank <= 2 second operand, not transposed first
    operand) flattens the first operand's leading dims into M (one GEMM); otherwise a batched
    GEMM over the result's leading dims. A transposed operand is a flag of the same GEMM
    (cuBLAS ``transa``/``transb``), never a copy."""
    a, b = ins[0], ins[1]
    assert isinstance(a, TensorType) and isinstance(b, TensorType)
    ta, tb = _trans(attrs)
    sa, sb = swap_last(a.shape, ta), swap_last(b.shape, tb)
    k = sa[-1] if sa else 1
    n = sb[-1] if len(sb) >= 2 else 1
    if len(sb) <= 2 and not (ta and len(sa) > 2):
        return GemmShape(1, numel(a) // k if k else 0, n, k)
    out = outs[0]
    assert isinstance(out, TensorType)
    m = sa[-2] if len(sa) >= 2 else 1
    batch = math.prod(out.shape[:-2]) if len(sa) >= 2 else math.prod(out.shape[:-1])
    return GemmShape(batch, m, n, k)


MATMUL = register(
    OpDef(
        name="MatMul",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.GEMM,
        inputs=("A", "B"),
        outputs=("Y",),
        infer=_matmul_rule,
        attrs={
            "transA": AttrSpec("int", 0, (0, 1)),
            "transB": AttrSpec("int", 0, (0, 1)),
            # float8 operands: how the backward scales the gradient to E5M2 (Float8Cast's)
            "grad_scaling": AttrSpec("str", DYNAMIC_SCALING, FLOAT8_SCALINGS),
        },
        reference=_matmul_ref,
        flops=_matmul_flops,
        gemm=_matmul_gemm,
        doc="Matrix product with numpy broadcasting of batch dims; transA/transB read an operand "
        "with its last two dims swapped (a GEMM's transpose flag, no copy). Two float8 operands "
        "(Float8Cast's) multiply on the FP8 tensor cores into bf16 (torch._scaled_mm); the "
        "backward casts the gradient to E5M2 with ``grad_scaling``.",
        sharding=sharding_rules.matmul,
    )
)


def _gemm_rule(ctx: TypeCtx) -> Sequence[Type]:
    a, b = ctx.tensor(0), ctx.tensor(1)
    same_dtype(ctx, list(range(len(ctx.types))))
    if a.rank != 2 or b.rank != 2:
        ctx.fail(
            "Gemm inputs A and B must be matrices",
            0 if a.rank != 2 else 1,
            "rank 2",
            a.rank if a.rank != 2 else b.rank,
        )
    m, k = a.shape[::-1] if ctx.attr("transA") else a.shape
    k2, n = b.shape[::-1] if ctx.attr("transB") else b.shape
    if k != k2:
        ctx.fail(f"Gemm contraction mismatch: {a.shape} @ {b.shape}", 1, k, k2)
    if len(ctx.types) == 3:
        c = ctx.tensor(2)
        fits = c.rank <= 2 and all(d in (1, w) for d, w in zip(c.shape[::-1], (n, m), strict=False))
        if not fits:
            ctx.fail(f"Gemm bias of shape {c.shape} does not broadcast to {(m, n)}", 2, (m, n), c.shape)
    return (ctx.out(a.dtype, (m, n)),)


def _gemm_ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
    a, b = np.asarray(args[0]), np.asarray(args[1])
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    y = float_attr(attrs, "alpha", 1.0) * (a @ b)
    if len(args) == 3:
        y = y + float_attr(attrs, "beta", 1.0) * np.asarray(args[2])
    return (np.asarray(y).astype(a.dtype, copy=False),)


def _gemm_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    a = ins[0]
    assert isinstance(a, TensorType)
    k = a.shape[0] if attrs.get("transA", 0) else a.shape[1]
    return 2.0 * numel(outs[0]) * k + (2.0 * numel(outs[0]) if len(ins) == 3 else 0.0)


def _gemm_gemm(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> GemmShape:
    a, out = ins[0], outs[0]
    assert isinstance(a, TensorType) and isinstance(out, TensorType)
    k = a.shape[0] if attrs.get("transA", 0) else a.shape[1]
    return GemmShape(1, out.shape[0], out.shape[1], k)


GEMM = register(
    OpDef(
        name="Gemm",
        family=FAMILY,
        cost_class=COST_CLASS,
        fusion=Fusion.GEMM,
        inputs=("A", "B", "C?"),
        outputs=("Y",),
        infer=_gemm_rule,
        attrs={
            "alpha": AttrSpec("float", 1.0),
            "beta": AttrSpec("float", 1.0),
            "transA": AttrSpec("int", 0, (0, 1)),
            "transB": AttrSpec("int", 0, (0, 1)),
        },
        reference=_gemm_ref,
        flops=_gemm_flops,
        gemm=_gemm_gemm,
        doc="ONNX Gemm: Y = alpha * A' @ B' + beta * C, with optional transposes and bias.",
        sharding=sharding_rules.gemm,
    )
)


# -- gradient rules (contract: distir.ops.gradrules) --------------------------------------------
def _matmul_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """Y = A' @ B' with numpy semantics (A' = A with its last two dims swapped when transA, B'
    likewise). 1-D operands (never transposed) are promoted to matrices (A: (1, k), B: (k, 1))
    by reshapes; then dA' = dY @ B'ᵀ and dB' = A'ᵀ @ dY, each one MatMul whose transpose flags
    make it come out in its input's own layout — a GEMM's operand flags, as cuBLAS, torch
    autograd and Megatron-LM run a linear layer's backward, never a Transpose copy — and summed
    back over the batch dims it was broadcast along. When B is a matrix and A is batched and not
    transposed (a weight applied to a batch of activations), dB is one matmul of the flattened
    batch instead: (Σ rows, k)ᵀ @ (Σ rows, n)."""
    dy = first(douts)
    ta, tb = _trans(op.attrs)
    at, bt = ctx.type(op.inputs[0]), ctx.type(op.inputs[1])
    if at.dtype.is_float8:  # the gradient cast to E5M2, both products in float8
        scaling = op.attrs.get("grad_scaling", DYNAMIC_SCALING)
        if scaling == DYNAMIC_SCALING:  # the default, unprinted
            (dy,) = ctx.op("Float8Cast", dy, to=DType.f8e5m2)
        else:
            (dy,) = ctx.op("Float8Cast", dy, to=DType.f8e5m2, scaling=scaling)
    a_shape, b_shape = at.shape, bt.shape
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    y2 = (*batch, swap_last(a2, ta)[-2], swap_last(b2, tb)[-1])
    a, b = ctx.primal(op.inputs[0]), ctx.primal(op.inputs[1])
    if a2 != a_shape:
        a = reshape(ctx, a, a2)
    if b2 != b_shape:
        b = reshape(ctx, b, b2)
    if y2 != ctx.type(op.outputs[0]).shape:
        dy = reshape(ctx, dy, y2)
    if not ta:  # dA = dY @ B'ᵀ
        (da,) = ctx.op("MatMul", dy, b, **_flags(0, 1 - tb))
    else:  # dA = (dY @ B'ᵀ)ᵀ = B' @ dYᵀ
        (da,) = ctx.op("MatMul", b, dy, **_flags(tb, 1))
    da = unbroadcast(ctx, da, a2, (*batch, a2[-2], a2[-1]))
    if len(b2) == 2 and len(a2) > 2 and not ta:
        rows = math.prod(a2[:-1])
        a_flat, dy_flat = reshape(ctx, a, (rows, a2[-1])), reshape(ctx, dy, (rows, y2[-1]))
        (db,) = ctx.op("MatMul", *((dy_flat, a_flat) if tb else (a_flat, dy_flat)), transA=1)
    else:
        if not tb:  # dB = A'ᵀ @ dY
            (db,) = ctx.op("MatMul", a, dy, **_flags(1 - ta, 0))
        else:  # dB = (A'ᵀ @ dY)ᵀ = dYᵀ @ A'
            (db,) = ctx.op("MatMul", dy, a, **_flags(1, ta))
        db = unbroadcast(ctx, db, b2, (*batch, b2[-2], b2[-1]))
    if a2 != a_shape:
        da = reshape(ctx, da, a_shape)
    if b2 != b_shape:
        db = reshape(ctx, db, b_shape)
    return [da, db]


def _flags(ta: int, tb: int) -> dict[str, int]:
    """MatMul's transpose attributes, the ones set only (a plain product prints as before)."""
    return {k: 1 for k, v in (("transA", ta), ("transB", tb)) if v}


def _gemm_grad(ctx: GradCtx, op: Op, douts: Sequence[Value | None]) -> Sequence[Value | None]:
    """Y = alpha·A'·B' + beta·C (A' = Aᵀ when transA, B' likewise): each gradient is one Gemm
    with the transposes arranged so it comes out in its input's layout; dC = beta·dY summed to
    C's shape."""
    dy = first(douts)
    ta, tb = int_attr(op.attrs, "transA", 0), int_attr(op.attrs, "transB", 0)
    alpha, beta = float_attr(op.attrs, "alpha", 1.0), float_attr(op.attrs, "beta", 1.0)
    a, b = ctx.primal(op.inputs[0]), ctx.primal(op.inputs[1])
    scaled: dict[str, Any] = {"alpha": alpha} if alpha != 1.0 else {}
    if not ta:  # dA = alpha·dY·B'ᵀ
        (da,) = ctx.op("Gemm", dy, b, transB=1 - tb, **scaled)
    else:  # dA = (alpha·dY·B'ᵀ)ᵀ = alpha·B'·dYᵀ
        (da,) = ctx.op("Gemm", b, dy, transA=tb, transB=1, **scaled)
    if not tb:  # dB = alpha·A'ᵀ·dY
        (db,) = ctx.op("Gemm", a, dy, transA=1 - ta, **scaled)
    else:  # dB = (alpha·A'ᵀ·dY)ᵀ = alpha·dYᵀ·A'
        (db,) = ctx.op("Gemm", dy, a, transA=1, transB=ta, **scaled)
    if len(op.inputs) == 2:
        return [da, db]
    dc = dy if beta == 1.0 else ctx.op("Scale", dy, alpha=beta)[0]
    return [da, db, unbroadcast(ctx, dc, ctx.type(op.inputs[2]).shape, ctx.type(op.outputs[0]).shape)]


MATMUL.fill("grad", _matmul_grad)
GEMM.fill("grad", _gemm_grad)


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
def _gemm_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """One GEMM with the bias as its epilogue (``addmm``) when there is one."""
    a = xs[0].T if int_attr(attrs, "transA", 0) else xs[0]
    b = xs[1].T if int_attr(attrs, "transB", 0) else xs[1]
    alpha, beta = float_attr(attrs, "alpha", 1.0), float_attr(attrs, "beta", 1.0)
    if len(xs) == 3:
        return (ctx.torch.addmm(xs[2], a, b, beta=beta, alpha=alpha),)
    y = a @ b
    return (y if alpha == 1.0 else y * alpha,)


def _matmul_torch(ctx: TorchContext, xs: Sequence[Any], attrs: Attrs) -> tuple[Any, ...]:
    """``torch.matmul`` of the operands, a transposed one as a view (``.mT``): torch hands cuBLAS
    the view's strides as its transpose flag, as autograd's backward of ``mm``/``linear`` does."""
    ta, tb = _trans(attrs)
    return (ctx.torch.matmul(xs[0].mT if ta else xs[0], xs[1].mT if tb else xs[1]),)


MATMUL.fill("torch", _matmul_torch)
GEMM.fill("torch", _gemm_torch)
