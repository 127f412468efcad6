"""Linear algebra: MatMul (numpy/ONNX batched semantics) and Gemm (Y = alpha·A'·B' + beta·C)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distir.ir.types import TensorType, Type
from distir.ir.values import Attrs
from distir.ops import sharding as sharding_rules
from distir.ops._rules import broadcast_shapes, float_attr, numel, same_dtype
from distir.ops.registry import AttrSpec, OpDef, TypeCtx, register

FAMILY = "linalg"


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


def _matmul_rule(ctx: TypeCtx) -> Sequence[Type]:
    same_dtype(ctx, [0, 1])
    a, b = ctx.tensor(0), ctx.tensor(1)
    return (ctx.out(a.dtype, _matmul_shape(ctx, a.shape, b.shape)),)


def _matmul_flops(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    a = ins[0]
    k = a.shape[-1] if isinstance(a, TensorType) and a.shape else 1
    return 2.0 * numel(outs[0]) * k


MATMUL = register(
    OpDef(
        name="MatMul",
        family=FAMILY,
        inputs=("A", "B"),
        outputs=("Y",),
        infer=_matmul_rule,
        reference=lambda args, attrs: (np.matmul(args[0], args[1]),),
        flops=_matmul_flops,
        doc="Matrix product with numpy broadcasting of batch dims.",
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


GEMM = register(
    OpDef(
        name="Gemm",
        family=FAMILY,
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
        doc="ONNX Gemm: Y = alpha * A' @ B' + beta * C, with optional transposes and bias.",
        sharding=sharding_rules.gemm,
    )
)
