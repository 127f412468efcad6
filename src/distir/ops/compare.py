"""Comparison and logic ops (ONNX names), all with bool results: Equal, Less, LessOrEqual,
Greater, GreaterOrEqual (numpy broadcasting of two inputs of one dtype), IsNaN (a float input),
Not, And, Or (bool inputs).

They are what exporters emit for masks (a causal mask built from ``Range`` and ``LessOrEqual``,
PyTorch's guard against fully masked softmax rows: ``Where(IsNaN(p), 0, p)``). A bool result
carries no gradient, so like ``Shape`` they have no gradient rule (autodiff treats them as
constants); one FLOP per result element; pointwise sharding, no pending sum passes through (a
comparison of partial sums is not the comparison of the sums).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from distir.ir.types import DType, Type
from distir.ir.values import Attrs
from distir.ops._rules import broadcast_shapes, out_numel_flops, same_dtype
from distir.ops._torch import binary, unary
from distir.ops.registry import CostClass, Fusion, Kink, OpDef, TypeCtx, register
from distir.ops.sharding import pointwise

FAMILY = "compare"
COST_CLASS = CostClass.COMPARE  # how the family's ops are costed


def _compare_rule(ctx: TypeCtx) -> Sequence[Type]:
    same_dtype(ctx, [0, 1])
    shape = broadcast_shapes(ctx, [ctx.tensor(0).shape, ctx.tensor(1).shape])
    return (ctx.out(DType.bool, shape),)


def _logic_rule(ctx: TypeCtx) -> Sequence[Type]:
    for i in range(len(ctx.types)):
        t = ctx.tensor(i)
        if t.dtype is not DType.bool:
            ctx.fail(f"{ctx.op.name} needs bool inputs (input {i + 1})", i, DType.bool, t.dtype)
    shape = broadcast_shapes(ctx, [ctx.tensor(i).shape for i in range(len(ctx.types))])
    return (ctx.out(DType.bool, shape),)


def _isnan_rule(ctx: TypeCtx) -> Sequence[Type]:
    t = ctx.tensor(0)
    if not t.dtype.is_float:
        ctx.fail("IsNaN needs a floating-point input", 0, "a float dtype", t.dtype)
    return (ctx.out(DType.bool, t.shape),)


def _bool_ref(fn: Callable[..., Any]) -> Callable[[Sequence[Any], Attrs], Sequence[Any]]:
    def ref(args: Sequence[Any], attrs: Attrs) -> Sequence[Any]:
        return (np.asarray(fn(*(np.asarray(a) for a in args)), dtype=np.bool_),)

    return ref


def _op(
    name: str, inputs: tuple[str, ...], rule: Callable[[TypeCtx], Sequence[Type]], fn: Any, doc: str
) -> OpDef:
    return register(
        OpDef(
            name=name,
            family=FAMILY,
            cost_class=COST_CLASS,
            fusion=Fusion.POINTWISE,
            inputs=inputs,
            outputs=("C",),
            infer=rule,
            reference=_bool_ref(fn),
            flops=out_numel_flops(1.0),
            doc=doc,
            sharding=pointwise(),
        )
    )


EQUAL = _op("Equal", ("A", "B"), _compare_rule, np.equal, "C = (A == B), numpy broadcasting, bool")
LESS = _op("Less", ("A", "B"), _compare_rule, np.less, "C = (A < B), numpy broadcasting, bool")
LESS_OR_EQUAL = _op(
    "LessOrEqual", ("A", "B"), _compare_rule, np.less_equal, "C = (A <= B), numpy broadcasting, bool"
)
GREATER = _op("Greater", ("A", "B"), _compare_rule, np.greater, "C = (A > B), numpy broadcasting, bool")
GREATER_OR_EQUAL = _op(
    "GreaterOrEqual", ("A", "B"), _compare_rule, np.greater_equal, "C = (A >= B), numpy broadcasting, bool"
)
for _ordered in (LESS, LESS_OR_EQUAL, GREATER, GREATER_OR_EQUAL):  # true or false by the sign of A - B
    _ordered.fill("kink", Kink(0, 1))
IS_NAN = _op("IsNaN", ("X",), _isnan_rule, np.isnan, "C = isnan(X) of a float X")
NOT = _op("Not", ("X",), _logic_rule, np.logical_not, "C = not X (bool)")
AND = _op("And", ("A", "B"), _logic_rule, np.logical_and, "C = A and B (bool, numpy broadcasting)")
OR = _op("Or", ("A", "B"), _logic_rule, np.logical_or, "C = A or B (bool, numpy broadcasting)")


# -- torch implementations (contract: distir.ops._torch) ----------------------------------------
EQUAL.fill("torch", binary(lambda ctx, a, b: ctx.torch.eq(a, b)))
LESS.fill("torch", binary(lambda ctx, a, b: ctx.torch.lt(a, b)))
LESS_OR_EQUAL.fill("torch", binary(lambda ctx, a, b: ctx.torch.le(a, b)))
GREATER.fill("torch", binary(lambda ctx, a, b: ctx.torch.gt(a, b)))
GREATER_OR_EQUAL.fill("torch", binary(lambda ctx, a, b: ctx.torch.ge(a, b)))
IS_NAN.fill("torch", unary(lambda ctx, x: ctx.torch.isnan(x)))
NOT.fill("torch", unary(lambda ctx, x: ctx.torch.logical_not(x)))
AND.fill("torch", binary(lambda ctx, a, b: ctx.torch.logical_and(a, b)))
OR.fill("torch", binary(lambda ctx, a, b: ctx.torch.logical_or(a, b)))
